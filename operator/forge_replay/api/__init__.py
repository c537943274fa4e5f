from forge_replay.api.dump_path import eval_path, is_template, path_problem, train_path  # noqa: F401
