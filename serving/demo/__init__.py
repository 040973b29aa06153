"""The offline demo: synthetic LoRA files of real names and shapes (`synthetic`, `synthetic_lycoris`; the tests
and benchmarks use them too) and the demo's own LoRAs and previews (`loras`)."""
