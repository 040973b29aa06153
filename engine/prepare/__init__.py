"""From a LoRA reference to a prepared adapter in the host cache: resolve, fetch, check, prepare (`preparation`
runs the steps in order; `loadgate` bounds the loads in flight)."""
