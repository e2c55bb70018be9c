"""Whole-program passes of ``nox -s minimize`` that one launch can check at once.

pysource-minimize removes one piece of syntax per test, and a DDP launch costs seconds, so two
kinds of change that a deletion reducer pays for piece by piece are proposed here in one
candidate each (the harness still judges each candidate: nothing is accepted unseen):

- **value folding**: a user's program reads most of its numbers and names through a config
  (``cfg["data"]["batch_size"]``, the hydra style) or its objects' attributes
  (``self.backbone.out_features``). The program is run once with every subscript by a constant
  key, and every attribute read as a value, recorded (``instrument``); a read that gave one and the same
  plain value (a number, a string, a bool, None, a short list or tuple of those) every time, in
  every process, is replaced by that value (``fold``). The config entries then become dead, and
  go with the next pass.
- **dead definitions**: module-level functions, classes, imports and assignments whose names
  nothing reads (``drop_unused``), repeated until none is left.
- **unused parameters** with the arguments of every call (``drop_unused_params``).
- **no-op statements**: docstrings, bare constants, ``pass``, conditions on a constant
  (``drop_noops``).
- **inlining**: a function or method with one caller pasted there (``inline``), and a variable
  read once moved into its read (``inline_variables``). Both refuse whenever a name could
  change meaning; what they cannot see (an evaluation order that matters) the harness judges.
- **constants**: a literal every call passes bound into the function (``bind_constant_args``),
  and what a literal makes plain written plainly (``fold_literals``).
- **Lightning's shapes**: a sub-module class flattened into its owner (``flatten_submodule``),
  a data module used once replaced by its loaders (``loaders_for_datamodule``), a module that
  only wraps another replaced by it (``unwrap_module``).

The passes that edit in place (``inline``, ``flatten_submodule``, ``loaders_for_datamodule``) are
each one function on purpose: every refusal is checked on the same parsed trees before the first
edit, and the edits reuse the nodes the checks found. Split, the checks and the edits would pass a
dozen nodes between them, and a refusal could come after an edit.
"""
