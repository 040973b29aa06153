"""LoRA Switchboard past one GPU: the Ray Serve application (`app`), its ingress and pool replicas, and the JSON
wire format both sides share (`wire`, importable without ray)."""
