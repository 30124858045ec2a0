"""fxkit.loader: a parallel safetensors loader that stands on its own (imports nothing from the engine)."""
