"""The text preview for the UI: computed by `service.text_preview`, rendered by `ui/preview.py`."""

from __future__ import annotations

from cosyserve.service import text_preview
from cosyserve.service.access.principals import Principal
from cosyserve.service.assembly import Service
from cosyserve.service.text_preview import ReadingFields, TextPreview


class PreviewPart:
    """The UI bridge's part that says how a text will be read."""

    service: Service

    def text_preview(
        self, principal: Principal | None, text: str, fields: ReadingFields, with_written: bool = False
    ) -> TextPreview:
        """How the model will read `text` from a synthesis tab with these fields (`with_written`: with the
        typed text of each sentence); InputError when the model is not loaded yet or synthesis would refuse
        the text too."""
        return text_preview.text_preview(self.service, principal, text, fields, with_written)

    def sentence_total(self, text: str) -> int:
        """How many sentences a long-text job for `text` will speak (for its progress bar)."""
        return text_preview.sentence_total(self.service, text)
