"""What serving a model costs in HBM: the model presets (:mod:`.models`) and the capacity rule
(:mod:`.capacity`), the largest batch a table placement leaves room for.  Plain arithmetic, no torch:
a suite, a record, the serve executor and advise all read it."""
