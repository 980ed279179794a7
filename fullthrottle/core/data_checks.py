"""Cell checks that stop a quiet guess: dirty numbers and labels written several ways.

Spreadsheets and lab systems write numbers as `18,9` (a decimal comma), `1,234.5` (thousands
separators), `12 kg` (a unit) or `n.a.` (their own missing marker). One such cell makes CSV
readers type a whole numeric column as text: it would then become a categorical column with a
value per number, or fail inside Transform. Labels that differ only by whitespace or case
(`Adelie` and `Adelie `) would each become a class of their own. The checks here find both and
say what to do, with the values and where they are.

Pure: callers hand in cells as `(place, value)` pairs (place: "line 7", "part-0.gz record 12")
and get a `Finding` (or None) back. Three callers use the same checks:

- `fullthrottle init` reports them on its sample (fullthrottle/core/columns.py);
- `fullthrottle.core.staging` stops `fullthrottle run` in its first seconds (the whole CSV,
  read with the configured `data.decimal`, `data.thousands`, `data.na_values`);
- the pipeline's DataGate stops every run before Transform (the data as ExampleGen read it, on
  any runner; components/data_gate.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# A column is "number-like" (init reports it instead of calling it categorical) when at least
# this share of its present cells are numbers, plain or in another notation.
NUMBER_LIKE_FRACTION = 0.9
# How many distinct values a message shows per kind of problem, and places per value.
MAX_VALUES = 3
MAX_PLACES = 3
MAX_VALUE_CHARS = 40

# Units written after numbers in exported tables. A closed list: "3A" could be a code as well
# as three amperes, and a code column must not look numeric.
_UNITS = (
    *("%", "‰", "°", "°C", "°F", "K", "$", "€", "£", "¥", "₹"),
    *("kg", "g", "mg", "µg", "t", "lb", "lbs", "oz"),
    *("km", "m", "cm", "mm", "µm", "nm", "in", "ft", "mi"),
    *("l", "L", "ml", "mL", "cl", "dl"),
    *("s", "ms", "µs", "min", "h", "hr", "hrs", "d", "days"),
    *("Hz", "kHz", "MHz", "GHz", "W", "kW", "MW", "V", "mV", "mA", "kWh", "Wh"),
    *("Pa", "kPa", "hPa", "bar", "psi", "J", "kJ", "cal", "kcal", "mol", "mmol", "dB", "px"),
    *("KB", "kB", "MB", "GB", "TB", "USD", "EUR", "GBP"),
)
# Kinds of cells that are not numbers as written, and how each is fixed.
DECIMAL_COMMA = "decimal comma"
THOUSANDS_COMMA = "thousands comma"
THOUSANDS_DOT = "decimal comma and thousands dot"
THOUSANDS_SPACE = "thousands space"
THOUSANDS_APOSTROPHE = "thousands apostrophe"
UNIT = "unit"
TEXT = "text"
# A kind is "formatted" when the cell is a number in another notation (not stray text).
FORMATTED = (
    DECIMAL_COMMA,
    THOUSANDS_COMMA,
    THOUSANDS_DOT,
    THOUSANDS_SPACE,
    THOUSANDS_APOSTROPHE,
    UNIT,
)
_KIND_PATTERNS = (
    (THOUSANDS_DOT, re.compile(r"[+-]?\d{1,3}(\.\d{3})+,\d+")),
    (THOUSANDS_COMMA, re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")),
    (DECIMAL_COMMA, re.compile(r"[+-]?\d*,\d+")),
    (THOUSANDS_SPACE, re.compile(r"[+-]?\d{1,3}([ \u00a0\u202f]\d{3})+([.,]\d+)?")),
    (THOUSANDS_APOSTROPHE, re.compile(r"[+-]?\d{1,3}(['\u2019]\d{3})+([.,]\d+)?")),
    # 12 kg, 5%, 37.5 °C, 3.5mm, $12, € 3,50: a number with a known unit or currency symbol.
    (
        UNIT,
        re.compile(
            rf"[+-]?\d+([.,]\d+)?\s?(?:{'|'.join(map(re.escape, sorted(_UNITS, key=len, reverse=True)))})"
            r"|[$€£¥₹]\s?[+-]?\d+([.,]\d+)?"
        ),
    ),
)
_WHAT = {
    DECIMAL_COMMA: "a decimal comma",
    THOUSANDS_COMMA: "thousands separators",
    THOUSANDS_DOT: "a decimal comma and thousands dots",
    THOUSANDS_SPACE: "thousands separated by spaces",
    THOUSANDS_APOSTROPHE: "thousands separated by apostrophes",
    UNIT: "a unit or currency",
}
_FIX = {
    DECIMAL_COMMA: "set `data.decimal: ','`",
    THOUSANDS_COMMA: "set `data.thousands: ','`",
    THOUSANDS_DOT: "set `data.decimal: ','` and `data.thousands: '.'`",
    THOUSANDS_SPACE: "set `data.thousands: ' '`",
    THOUSANDS_APOSTROPHE: 'set `data.thousands: "\'"`',
    UNIT: "write the numbers without the unit (name the unit in the column name instead)",
}
# A classification label (`data.task`) with more distinct values than this, most of them unique,
# looks continuous (or like an identifier): too many to be classes.
LABEL_MAX_CLASSES = 200


def looks_continuous(distinct: int, present: int) -> bool:
    """True for a label column with too many distinct values to be classes."""
    return distinct > LABEL_MAX_CLASSES and distinct > present / 2


@dataclass(frozen=True)
class Finding:
    """One column whose cells need a decision, in words a person can act on."""

    column: str
    where: str  # the config field that lists the column: "`data.numeric`", "`data.label`"
    problem: str  # what was found, with values and places
    fix: str  # what to do

    def __str__(self) -> str:
        where = f" (in {self.where})" if self.where else ""
        return f"column {self.column!r}{where}: {self.problem}. {self.fix}"


def report(findings: Iterable[Finding], *, source: str) -> str:
    """One paragraph for a list of findings: the source, then each finding."""
    items = list(findings)
    count = (
        f"{len(items)} column{'s' if len(items) != 1 else ''} need{'s' if len(items) == 1 else ''}"
    )
    return f"{source}: {count} a decision before training: " + " ".join(
        f"({i}) {finding}" for i, finding in enumerate(items, start=1)
    )


# --- numbers ---------------------------------------------------------------------------------
def normalize_number(cell: str, *, decimal: str = ".", thousands: str | None = None) -> str | None:
    """`cell` as a plain number text (`1,234.5` -> `1234.5` with thousands ","), or None.

    Thousands separators count only in groups of three digits (`18,9` is never 189), and a
    decimal comma is read only when `decimal` is ","; a cell with a decimal point is still read
    (data with both, as in `18.5` next to `18,9`, is common).
    """
    text = cell.strip()
    if thousands == " ":
        # Spreadsheets group digits with no-break spaces as often as with spaces.
        text = text.replace("\u00a0", " ").replace("\u202f", " ")
    if thousands and thousands in text:
        grouped = re.fullmatch(
            rf"([+-]?)(\d{{1,3}}(?:{re.escape(thousands)}\d{{3}})+)((?:{re.escape(decimal)}\d+)?)",
            text,
        )
        if grouped is None:
            return None
        text = grouped[1] + grouped[2].replace(thousands, "") + grouped[3]
    if decimal != "." and decimal in text:
        if text.count(decimal) != 1 or "." in text:
            return None
        text = text.replace(decimal, ".")
    try:
        float(text)
    except ValueError:
        return None
    return text


def cell_kind(cell: str) -> str:
    """Why a cell that is not a plain number is not one: a notation (`FORMATTED`) or TEXT."""
    text = cell.strip()
    for kind, pattern in _KIND_PATTERNS:
        if pattern.fullmatch(text):
            return kind
    return TEXT


@dataclass
class _Values:
    """Counts and first places of the distinct values of one kind."""

    counts: Counter = field(default_factory=Counter)
    places: dict[str, list[str]] = field(default_factory=dict)

    def add(self, value: str, place: str) -> None:
        self.counts[value] += 1
        seen = self.places.setdefault(value, [])
        if len(seen) < MAX_PLACES:
            seen.append(place)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def phrases(self, verb: str, limit: int = MAX_VALUES) -> list[str]:
        """`'heavy' is not a number (line 7, line 47 and 7 more)`, most frequent values first."""
        shown = [
            f"{_show(value)} {verb} ({self.where(value)})"
            for value, _ in self.counts.most_common(limit)
        ]
        more = len(self.counts) - limit
        if more > 0:
            shown.append(f"and {more} other value{'s' if more > 1 else ''} like these")
        return shown

    def where(self, value: str) -> str:
        """The first places of `value`, and how many more there are."""
        places = ", ".join(self.places[value])
        unnamed = self.counts[value] - len(self.places[value])
        return places + (f" and {unnamed} more" if unnamed else "")


@dataclass
class NumberReport:
    """What the present cells of one column are: numbers, numbers in another notation, text."""

    column: str
    present: int = 0
    numbers: int = 0
    by_kind: dict[str, _Values] = field(default_factory=dict)

    @property
    def unparsed(self) -> int:
        return self.present - self.numbers

    @property
    def looks_numeric(self) -> bool:
        """Numbers except a few cells (or numbers in another notation throughout)."""
        formatted = sum(v.total for k, v in self.by_kind.items() if k in FORMATTED)
        return (
            self.present > 0 and (self.numbers + formatted) >= NUMBER_LIKE_FRACTION * self.present
        )

    def add(
        self, place: str, cell: str, *, decimal: str = ".", thousands: str | None = None
    ) -> None:
        """Reads one cell (an empty one is missing, not counted as present)."""
        if not cell.strip():
            return
        self.present += 1
        if normalize_number(cell, decimal=decimal, thousands=thousands) is not None:
            self.numbers += 1
            return
        self.by_kind.setdefault(cell_kind(cell), _Values()).add(cell, place)

    def finding(self, *, where: str, categorical_hint: str) -> Finding | None:
        """The finding for the cells that are not numbers as read, or None if there are none.

        `categorical_hint` ends the fix: how to say the column is categories on purpose.
        """
        if not self.unparsed:
            return None
        phrases = []
        for kind in (*FORMATTED, TEXT):
            values = self.by_kind.get(kind)
            if values is not None:
                phrases += values.phrases(
                    "is not a number" if kind == TEXT else f"has {_WHAT[kind]}"
                )
        problem = (
            f"{self.unparsed} of {self.present} present cells are not numbers as written: "
            + "; ".join(phrases)
        )
        fixes = [_FIX[kind] for kind in FORMATTED if kind in self.by_kind]
        text = self.by_kind.get(TEXT)
        if text is not None:
            shown = ", ".join(_show(v) for v, _ in text.counts.most_common(MAX_VALUES))
            fixes.append(
                f"if {shown} mean{'s' if len(text.counts) == 1 else ''} a missing value, add "
                f"{'it' if len(text.counts) == 1 else 'them'} to `data.na_values`, otherwise "
                "correct those cells"
            )
        fix = _sentence("; ".join(fixes) + f". {categorical_hint}")
        return Finding(self.column, where, problem, fix)


def inspect_numbers(
    column: str,
    cells: Iterable[tuple[str, str]],
    *,
    decimal: str = ".",
    thousands: str | None = None,
    na_values: Iterable[str] = (),
) -> NumberReport:
    """Reads `(place, cell)` pairs of one column as numbers with the given notation.

    Empty cells and `na_values` are missing (not counted as present).
    """
    missing = set(na_values)
    result = NumberReport(column)
    for place, cell in cells:
        if cell not in missing:
            result.add(place, cell, decimal=decimal, thousands=thousands)
    return result


# --- labels ----------------------------------------------------------------------------------
def label_key(value: str) -> str:
    """What two spellings of one class share: whitespace trimmed and collapsed, case folded."""
    return " ".join(value.split()).casefold()


@dataclass
class LabelReport:
    """The label values, grouped by `label_key`."""

    column: str
    groups: dict[str, _Values] = field(default_factory=dict)

    @property
    def near_duplicates(self) -> dict[str, _Values]:
        """The groups written in more than one way."""
        return {key: values for key, values in self.groups.items() if len(values.counts) > 1}

    def add(self, place: str, cell: str) -> None:
        """Reads one label cell (an empty one is missing)."""
        if cell.strip():
            self.groups.setdefault(label_key(cell), _Values()).add(cell, place)

    @property
    def spellings(self) -> dict[str, int]:
        """Each present label value as written, with its rows."""
        return {
            value: count
            for values in self.groups.values()
            for value, count in values.counts.items()
        }

    def merges(self) -> dict[str, str]:
        """Spelling -> the spelling it is merged into: the group's most frequent one, trimmed.

        Only spellings that change are listed.
        """
        merged = {}
        for values in self.groups.values():
            # Most frequent first; on a tie the spelling that needs no trimming, then the smallest.
            best = min(values.counts, key=lambda v: (-values.counts[v], v != v.strip(), v))
            canonical = " ".join(best.split())
            merged.update({v: canonical for v in values.counts if v != canonical})
        return merged

    def finding(self, *, mode: str) -> Finding | None:
        """Near-duplicate classes, unless `mode` is "keep" (different classes on purpose)."""
        groups = self.near_duplicates
        if not groups or mode == "keep":
            return None
        described = []
        for values in list(groups.values())[:MAX_VALUES]:
            spellings = []
            for value, count in values.counts.most_common():
                rows = f"{count} row{'s' if count > 1 else ''}"
                spellings.append(f"{_show(value)} ({rows}: {values.where(value)})")
            described.append(" and ".join(spellings))
        more = len(groups) - MAX_VALUES
        problem = (
            f"{len(groups)} class{'es are' if len(groups) > 1 else ' is'} written in more than "
            "one way (differing only in whitespace or case), and each spelling would train as a "
            "class of its own: " + "; ".join(described) + (f"; and {more} more" if more > 0 else "")
        )
        merged = self.merges()
        targets = ", ".join(_show(v) for v in dict.fromkeys(merged.values()))
        if mode == "merge":
            fix = (
                "`data.near_duplicate_labels: merge` is set, but this data reached ExampleGen "
                "unmerged: merging happens when `fullthrottle run` stages a CSV file, so stage the "
                "data that way or correct the labels in the data"
            )
        else:
            fix = (
                f"Set `data.near_duplicate_labels: merge` to merge each group into its most "
                f"frequent spelling ({targets}), or `keep` if they are different classes on "
                "purpose, or correct the labels in the data"
            )
        return Finding(self.column, "`data.label`", problem, _sentence(fix))


def inspect_labels(column: str, cells: Iterable[tuple[str, str]]) -> LabelReport:
    """Groups the present `(place, label)` cells of the label column by `label_key`."""
    result = LabelReport(column)
    for place, cell in cells:
        result.add(place, cell)
    return result


# --- header names ---------------------------------------------------------------------------
def check_header_names(header: list[str], *, source: str) -> None:
    """Refuses header names no column can have: empty, duplicated (surrounding whitespace is
    not part of a name), or holding a comma or line break. TFX's CsvExampleGen splits the
    header line at every comma and does not read quotes there, so `"weight, kg"` would become
    two columns whose names match nothing.

    Raises:
        DataError: naming the column(s) by position and name, and what to do.
    """
    from fullthrottle.core.errors import DataError

    for position, name in enumerate(header, start=1):
        if not name.strip():
            raise DataError(
                f"{source}: column {position} of the header has no name; name every column"
            )
        for bad, what in ((",", "a comma"), ("\n", "a line break"), ("\r", "a line break")):
            if bad in name:
                raise DataError(
                    f"{source}: column {position} of the header, {_show(name)}, holds {what}: "
                    "TFX's CSV reader (CsvExampleGen) splits the header line at every comma and "
                    "does not read quotes there. Rename the column (e.g. "
                    f"{_show(' '.join(name.replace(',', ' ').split()))})."
                )
    first: dict[str, int] = {}
    for position, name in enumerate(header, start=1):
        key = name.strip()
        if key in first:
            raise DataError(
                f"{source}: columns {first[key]} ({_show(header[first[key] - 1])}) and {position} "
                f"({_show(name)}) of the header have the same name once surrounding whitespace is "
                "removed; give every column its own name"
            )
        first[key] = position


# --- types as ExampleGen read them -------------------------------------------------------------
def type_findings(numeric: Iterable[str], types: Mapping[str, str]) -> list[Finding]:
    """Numeric columns that a schema (inferred or curated) types as text.

    `types` maps a column to its schema type ("INT", "FLOAT", "BYTES"). Transform reads numeric
    columns as numbers: a text-typed one would fail there, so it is stopped here.
    """
    return [
        Finding(
            column,
            "`data.numeric`",
            "the schema types it as text (BYTES): at least one cell is not a number as "
            "ExampleGen reads it",
            "Correct the cells (`data.decimal`, `data.thousands` and `data.na_values` apply when "
            "`fullthrottle run` stages a CSV file), or list the column under `data.categorical` "
            "if it holds categories.",
        )
        for column in numeric
        if types.get(column) == "BYTES"
    ]


# --- the DataGate: the data as ExampleGen read it ------------------------------------------
STAGING_NOTE = (
    "`data.decimal`, `data.thousands`, `data.na_values` and `data.near_duplicate_labels: merge` "
    "are applied when `fullthrottle run` stages a CSV file; data that reaches ExampleGen another "
    "way (TFRecords, a Kubeflow input folder) must already be written that way."
)


def gate_findings(
    *,
    numeric: Iterable[str],
    label: str,
    label_mode: str,
    cells: Mapping[str, Iterable[tuple[str, str]]],
    types: Mapping[str, str],
) -> list[Finding]:
    """What the DataGate stops on, besides ExampleValidator's anomalies.

    A regression label is passed in `numeric` too (a number in every row), and named as the label.
    `cells` holds the `(place, cell)` pairs of the numeric and label columns as ExampleGen read
    them (already staged, for a CSV run locally: plain numbers, missing cells empty); `types`
    the schema's type per column. A numeric column with a cell that is not a plain number, or
    typed as text, would fail in Transform; near-duplicate labels would train as extra classes.
    """
    return report_findings(
        numbers={column: inspect_numbers(column, cells.get(column, ())) for column in numeric},
        labels=inspect_labels(label, cells.get(label, ())),
        label_mode=label_mode,
        types=types,
    )


def report_findings(
    *,
    numbers: Mapping[str, NumberReport],
    labels: LabelReport,
    label_mode: str,
    types: Mapping[str, str],
) -> list[Finding]:
    """`gate_findings` from the reports of the cells (for a caller that reads them once, row
    by row): `numbers` per numeric column, in order, `labels` of the label column."""
    findings = []
    label = labels.column
    for column, column_numbers in numbers.items():
        if column == label:  # a regression label, checked as a number
            where = "`data.label`"
            hint = "Or, if the label holds classes, set `data.task: classification`."
        else:
            where = "`data.numeric`"
            hint = "Or, if the column holds categories, list it under `data.categorical`."
        finding = column_numbers.finding(where=where, categorical_hint=f"{hint} ({STAGING_NOTE})")
        if finding is None:
            finding = next(iter(type_findings([column], types)), None)
        if finding is not None:
            findings.append(finding)
    label_finding = labels.finding(mode=label_mode)
    if label_finding is not None:
        findings.append(label_finding)
    return findings


def _show(value: str) -> str:
    if len(value) > MAX_VALUE_CHARS:
        return f"{value[:MAX_VALUE_CHARS]!r}... ({len(value)} characters)"
    return repr(value)


def _sentence(text: str) -> str:
    text = text.strip()
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else text + "."
