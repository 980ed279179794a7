"""The bundled text data itself. The Transformer path end to end on it (held-out accuracy, raw
strings in English and Chinese) is checked on tests/test_local_devices.py's run, which trains it
over two devices."""

from __future__ import annotations

from fullthrottle.core import bundled


def test_bundled_text_dataset_is_what_the_generator_makes():
    shipped = bundled.text_topics_path().read_text(encoding="utf-8")
    assert shipped == bundled.generate_text_topics(), (
        "regenerate with: python -m fullthrottle.core.bundled"
    )
    assert any("\u4e00" <= ch <= "\u9fff" for ch in shipped), "the dataset must exercise CJK text"
