"""The one place served weights change: the exact fused swap (`swap`), the token patcher (`tokens`) and the fused
set that drives both (`fused`)."""
