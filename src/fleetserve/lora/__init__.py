"""LoRA adapters: validation, the registry and its storage tiers, mixed-adapter layers.

- :mod:`.safetensors_header`: a safetensors file's header, read without torch or pickle;
- :mod:`.shapes`: a base model's Linear shapes, and PEFT module names matched to them;
- :mod:`.validate`: an upload checked against its base before anything is loaded;
- :mod:`.store`: what the registry needs of an object store (listing, create-if-absent);
- :mod:`.registry`: adapters by ``tenant/name@version`` in the cold tier (object store);
- :mod:`.tiers`: the warm tier (local disk, least recently used leave first);
- :mod:`.declared`: adapters declared in the catalog, registered at start;
- :mod:`.mixed`, :mod:`.load`: the hot tier's torch side (one batch, many adapters).

Nothing is imported here, so the torch-free parts load without torch.
"""
