// TODO(issue 4): stub until implemented
