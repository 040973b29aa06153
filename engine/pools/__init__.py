"""Pools: one `Engine` per served base (`engine`), the router over them (`pools`, `routing`), device residency
(`residency`), and each engine's one queue (`scheduler`, `tickets`)."""
