"""The Hub's failures as the catalogue's errors, each naming what failed (one translation for every Hub call).

A gated repo is a 403, a missing repo, revision or file a 404, and an unreachable, slow, offline or malformed
Hub a 503 naming the endpoint; a header the file itself got wrong is already named and passes through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from .errors import GatedLoraError, HeaderError, HubUnavailableError, LoraNotFoundError

__all__ = ["hub_errors"]


@contextmanager
def hub_errors(
    what: str, *, endpoint: str, timeout_s: float, repo_id: str | None = None, revision: str | None = None
) -> Iterator[None]:
    """Turn huggingface_hub/httpx errors into catalogue errors that name `what` failed."""
    try:
        yield
    except HeaderError:
        raise  # the file's fault, already named (a ValueError, which would read as malformed JSON below)
    except GatedRepoError as e:
        raise GatedLoraError(f"LoRA repo {repo_id!r} is gated; this Space serves only LoRAs anyone can download") from e
    except RepositoryNotFoundError as e:
        raise LoraNotFoundError(
            f"LoRA repo {repo_id!r} was not found on the Hub (or it is private); accepted: a public model repo "
            "id 'owner/name'"
        ) from e
    except RevisionNotFoundError as e:
        raise LoraNotFoundError(
            f"revision {revision!r} of LoRA repo {repo_id!r} was not found; accepted: an existing branch, tag or "
            "commit sha"
        ) from e
    except EntryNotFoundError as e:
        raise LoraNotFoundError(f"a file of LoRA repo {repo_id!r} was not found while {what}") from e
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise HubUnavailableError(f"the Hub at {endpoint} answered HTTP {status} while {what}") from e
    except OfflineModeIsEnabled as e:
        raise HubUnavailableError(f"huggingface_hub's offline mode (HF_HUB_OFFLINE) is on while {what}") from e
    except httpx2.TimeoutException as e:
        raise HubUnavailableError(f"the Hub at {endpoint} did not answer within {timeout_s:g} s while {what}") from e
    except httpx2.HTTPError as e:
        raise HubUnavailableError(f"the Hub at {endpoint} could not be reached while {what}: {e}") from e
    except (ValueError, KeyError, TypeError) as e:
        # r.json() and ModelInfo(**data) on a malformed or truncated answer.
        raise HubUnavailableError(f"the Hub at {endpoint} answered malformed JSON while {what}: {e}") from e
