"""The data and schemas that ship with fullthrottle: nothing is downloaded at run time.

- `palmerpenguins` (the default data): `penguins.csv` from the PyPI package of that name, with
  the curated schema `bundled_data/penguins.pbtxt` (see the comments in the file for how it was
  curated), the data gate's contract for it.
- `bundled:text_topics`: `bundled_data/text_topics.csv`, short messages in English and Chinese
  about one of four topics, plus a numeric and a categorical column, so the Transformer path
  (and character tokenization of CJK text) runs end to end. It is generated here
  deterministically: regenerate it with `python -m fullthrottle.core.bundled`; a test checks
  the shipped file matches this code.
- `bundled:diabetes`: scikit-learn's diabetes data (`sklearn.datasets.load_diabetes`, shipped
  inside the scikit-learn package: 442 patients, ten measurements in their own units, and the
  disease progression a year later, a number from 25 to 346), a regression target
  (`configs/diabetes.yaml`). Written to a CSV in the temp folder when a run asks for it.
"""

from __future__ import annotations

import csv
import io
import os
import random
import tempfile
from pathlib import Path

from fullthrottle.core.config import BUNDLED_DIABETES, BUNDLED_PENGUINS, BUNDLED_TEXT, DataSpec
from fullthrottle.core.errors import DataError

BUNDLED_DATA_DIR = Path(__file__).resolve().parent / "bundled_data"
PENGUINS_SCHEMA = BUNDLED_DATA_DIR / "penguins.pbtxt"

TOPICS = {
    "sports": (
        ["match", "goal", "team", "coach", "league", "score", "season", "player", "stadium", "win"],
        ["比赛", "进球", "球队", "教练", "联赛", "得分", "球员", "冠军"],
    ),
    "tech": (
        [
            "laptop",
            "software",
            "chip",
            "battery",
            "update",
            "server",
            "code",
            "robot",
            "app",
            "screen",
        ],
        ["电脑", "软件", "芯片", "电池", "更新", "服务器", "代码", "手机"],
    ),
    "food": (
        [
            "recipe",
            "noodles",
            "bread",
            "spicy",
            "dinner",
            "soup",
            "kitchen",
            "sweet",
            "rice",
            "taste",
        ],
        ["面条", "米饭", "好吃", "厨房", "晚饭", "辣", "汤", "甜点"],
    ),
    "travel": (
        [
            "flight",
            "hotel",
            "beach",
            "train",
            "ticket",
            "mountain",
            "museum",
            "passport",
            "trip",
            "map",
        ],
        ["旅行", "酒店", "海边", "火车", "机票", "博物馆", "护照", "风景"],
    ),
}
FILLER_EN = [
    "the",
    "a",
    "really",
    "today",
    "new",
    "my",
    "this",
    "was",
    "very",
    "and",
    "we",
    "great",
]
FILLER_ZH = ["今天", "我们", "非常", "这个", "很", "的", "了", "真"]
ROWS = 1200
SEED = 20261130


def text_topics_path() -> Path:
    return BUNDLED_DATA_DIR / "text_topics.csv"


def bundled_path(name: str) -> Path:
    """The file behind a bundled dataset name (`data.path: palmerpenguins`, `bundled:...`)."""
    if name == BUNDLED_PENGUINS:
        import palmerpenguins

        return Path(palmerpenguins.__file__).parent / "data" / "penguins.csv"
    if name == BUNDLED_TEXT:
        return text_topics_path()
    if name == BUNDLED_DIABETES:
        return diabetes_csv_path()
    raise DataError(
        f"unknown bundled dataset {name!r}; bundled ones are {BUNDLED_PENGUINS!r}, "
        f"{BUNDLED_TEXT!r} and {BUNDLED_DIABETES!r}"
    )


def diabetes_csv() -> str:
    """scikit-learn's diabetes data as CSV text: the ten measurements in their own units (not
    scikit-learn's scaled copy), then `target`. Read from the installed package, never
    downloaded; the same scikit-learn gives the same bytes."""
    from sklearn.datasets import load_diabetes

    return load_diabetes(as_frame=True, scaled=False).frame.to_csv(index=False)


def diabetes_csv_path() -> Path:
    """`diabetes_csv` written to a file of its own in the temp folder (rewritten only when its
    content differs), for staging to read as it reads any CSV."""
    text = diabetes_csv()
    folder = Path(tempfile.gettempdir()) / f"fullthrottle-bundled-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    path = folder / "diabetes.csv"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    return path


def schema_path_for(spec: DataSpec) -> str | None:
    """The schema a run imports: `data.schema_path`, else the curated one for bundled penguins.

    None means "infer one with SchemaGen from the data itself" (which finds no anomalies in
    that same data: the gate then only guards against what SchemaGen's inference flags).
    """
    if spec.schema_path:
        return spec.schema_path
    if spec.path == BUNDLED_PENGUINS:
        return str(PENGUINS_SCHEMA)
    return None


def generate_text_topics(rows: int = ROWS, seed: int = SEED) -> str:
    """Returns the CSV text; same arguments, same bytes."""
    rng = random.Random(seed)
    topics = sorted(TOPICS)
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["message", "language", "length_hint", "topic"])
    for _ in range(rows):
        topic = rng.choice(topics)
        language = "zh" if rng.random() < 0.3 else "en"
        en_words, zh_words = TOPICS[topic]
        # 10% of messages borrow a keyword from another topic, so the task is not trivial.
        other = TOPICS[rng.choice([t for t in topics if t != topic])]
        if language == "zh":
            words = [rng.choice(zh_words) for _ in range(rng.randint(1, 3))]
            words += [rng.choice(FILLER_ZH) for _ in range(rng.randint(2, 5))]
            if rng.random() < 0.1:
                words.append(rng.choice(other[1]))
            rng.shuffle(words)
            message = "".join(words)
        else:
            words = [rng.choice(en_words) for _ in range(rng.randint(1, 3))]
            words += [rng.choice(FILLER_EN) for _ in range(rng.randint(3, 8))]
            if rng.random() < 0.1:
                words.append(rng.choice(other[0]))
            rng.shuffle(words)
            message = " ".join(words)
        # Some missing values, as real data has.
        length_hint = "" if rng.random() < 0.05 else str(len(message))
        writer.writerow([message, language, length_hint, topic])
    return out.getvalue()


if __name__ == "__main__":
    text_topics_path().write_text(generate_text_topics(), encoding="utf-8")
    print(f"wrote {text_topics_path()}")
