// TODO(issue 5): stub
