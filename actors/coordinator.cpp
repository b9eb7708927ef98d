// TODO(issue 4): coordinator actor (stub until implemented)
