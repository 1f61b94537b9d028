"""``fleetserve add SOURCE``: any model in one step.

The stages, one module each: :mod:`.source` finds the weights (a directory, the
Hugging Face cache, an object-store prefix) and refuses what cannot be a model;
``catalog.infer`` reads the family and the fields from the model's own files;
``bench.tune.reference`` checks the served replies against the library the model was
made for; :mod:`.spec_file` writes the spec with the evidence for each field; the tuner
tunes it; :mod:`.report` says what was found and measured. :mod:`.pipeline` runs them
in order and stops at the first that refuses, having written nothing.
"""
