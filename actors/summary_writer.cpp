// TODO(issue 4): summary_writer actor (stub until implemented)
