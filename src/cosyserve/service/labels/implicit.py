"""The implicit label's content (GB 45438-2025, metadata implicit label) and its binding to the audio.

The label is a JSON object stored under the metadata field `AIGC`, with the standard's keys:
- `Label`: the content's generated attribute; "1" = generated or synthesised by AI;
- `ContentProducer` / `ProduceID`: the provider's name or code, and the content's id (the output id);
- `ContentPropagator` / `PropagateID`: who distributes it and its id there (this server serves it too);
- `ReservedCode1`: the binding: `sha256-fmt:<hex>` of the container's format fields (sample rate,
  channels: what decides how the samples play) and the file's audio payload (its samples or codec
  frames, not the metadata), empty for a stream label written before the audio existed. Labels written
  before the format fields were bound say `sha256:<hex>` of the payload alone, and still verify;
- `ReservedCode2`: `hmac-sha256:<hex>` over all the other fields, keyed with the server's signing secret,
  so a changed field (or a hash copied from another file) is detected by the server that made it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

FIELD = "AIGC"
GENERATED = "1"  # the standard's "generated/synthesised" value; "2" and "3" mean possibly / suspected
HASH_PREFIX = "sha256:"  # the payload alone (labels written before BOUND_PREFIX)
BOUND_PREFIX = "sha256-fmt:"  # the format fields and the payload
SIGNATURE_PREFIX = "hmac-sha256:"
KEYS = ("Label", "ContentProducer", "ProduceID", "ReservedCode1", "ContentPropagator", "PropagateID")


@dataclass(frozen=True)
class ImplicitLabel:
    content_producer: str
    produce_id: str
    audio_sha256: str | None  # `bound_hash`'s; None: a stream label, written before the audio existed
    content_propagator: str = ""
    propagate_id: str = ""
    label: str = GENERATED

    def fields(self) -> dict[str, str]:
        return {
            "Label": self.label,
            "ContentProducer": self.content_producer,
            "ProduceID": self.produce_id,
            "ReservedCode1": f"{BOUND_PREFIX}{self.audio_sha256}" if self.audio_sha256 else "",
            "ContentPropagator": self.content_propagator,
            "PropagateID": self.propagate_id,
        }

    def to_json(self, secret: bytes) -> str:
        fields = self.fields()
        fields["ReservedCode2"] = signature(fields, secret)
        return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


def signature(fields: dict[str, Any], secret: bytes) -> str:
    """`hmac-sha256:<hex>` over the label's fields other than ReservedCode2, in a canonical JSON form."""
    signed = {key: str(fields.get(key, "")) for key in KEYS}
    canonical = json.dumps(signed, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return SIGNATURE_PREFIX + hmac.new(secret, canonical.encode("utf-8"), hashlib.sha256).hexdigest()


def audio_hash(payload: bytes) -> str:
    """A label's binding before the format fields were bound (HASH_PREFIX): the payload alone."""
    return hashlib.sha256(payload).hexdigest()


def bound_digest(format_fields: bytes) -> Any:
    """A SHA-256 fed the format fields (length first), for the payload to follow (in blocks, say)."""
    digest = hashlib.sha256()
    digest.update(len(format_fields).to_bytes(4, "big") + format_fields)
    return digest


def bound_hash(format_fields: bytes, payload: bytes) -> str:
    """The binding of BOUND_PREFIX: a file edited to play at another rate no longer matches."""
    digest = bound_digest(format_fields)
    digest.update(payload)
    return str(digest.hexdigest())


def parse(text: str) -> dict[str, Any] | None:
    """The label's fields, or None when the text is not a JSON object."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
