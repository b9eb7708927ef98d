// TODO(issue 4): training_loop actor (stub until implemented)
