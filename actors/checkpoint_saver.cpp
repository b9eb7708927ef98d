// TODO(issue 4): checkpoint_saver actor (stub until implemented)
