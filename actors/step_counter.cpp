// TODO(issue 4): step_counter actor (stub until implemented)
