// TODO(issue 4): session_supervisor actor (stub until implemented)
