"""The one way an adapter's cache key is made, from the spec's normalised ref and the revision and file it resolved to.

The resolver keys what it locates with it, and the cluster's replicas lease what a result used with it
(`serving.cluster.replica`), so both name one adapter alike: a Hub repo id; `local:` and the path inside the
local folder; a Civitai version (`civitai:<version>`, whichever form the request named it by, since its
revision is the version id).
"""

from __future__ import annotations

from engine.formats.adapters import AdapterKey
from engine.requests import LOCAL_PREFIX
from lora_catalog.civitai.refs import CIVITAI_PREFIX, is_civitai_ref

__all__ = ["adapter_key"]


def adapter_key(ref: str, revision: str, weight_name: str) -> AdapterKey:
    """The cache key of the file `ref` (a normalised spec's ref) resolved to at `revision`, `weight_name`."""
    if ref.startswith(LOCAL_PREFIX):
        return AdapterKey("local", ref.removeprefix(LOCAL_PREFIX), revision, weight_name)
    if is_civitai_ref(ref):
        # A model ref (`civitai:models/<m>`) resolves to one of its versions: the version is the identity.
        return AdapterKey("civitai", f"{CIVITAI_PREFIX}{revision}", revision, weight_name)
    return AdapterKey("hub", ref, revision, weight_name)
