"""``format = "columns"`` errors: a bad row names its file, line, column and value
(``TraceError``); a bad mapping names its key path (``ConfigError``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from column_traces import (
    BURST_COLUMNS,
    BURST_HEADER,
    burst,
    config_error,
    jsonl,
    load,
    spec,
    trace_error,
    write,
)

# --- trace errors: file, line, column, value --------------------------------------------------


def test_a_missing_column_names_it_the_file_and_the_columns_present(tmp_path: Path) -> None:
    path = burst(tmp_path)
    error = trace_error(load(path, {**BURST_COLUMNS, "input_tokens": "Prompt tokens"}))
    assert str(error) == (
        f"{path}:1: Prompt tokens: missing column, mapped by columns.input_tokens (columns "
        "found: Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type)"
    )
    assert (error.path, error.line, error.field) == (str(path), 1, "Prompt tokens")


def test_a_missing_filter_column(tmp_path: Path) -> None:
    path = burst(tmp_path)
    error = trace_error(load(path, filter={"column": "model", "equals": "ChatGPT"}))
    assert str(error).startswith(f"{path}:1: model: missing column, mapped by filter.column (")
    two = [{"column": "Model", "equals": "ChatGPT"}, {"column": "Tenant", "equals": "a"}]
    assert "mapped by filter[1].column" in str(trace_error(load(path, filter=two)))


def test_a_missing_json_field(tmp_path: Path) -> None:
    rows: list[object] = [{"t": 0, "p": 5, "o": 1, "m": "a"}, {"t": 1, "p": 5, "m": "a"}]
    columns = {"time": "t", "time_unit": "s", "input_tokens": "p", "output_tokens": "o"}
    path = jsonl(tmp_path, rows)
    error = trace_error(load(path, columns))
    assert (
        str(error)
        == f"{path}:2: o: missing field, mapped by columns.output_tokens (fields found: t, p, m)"
    )
    error = trace_error(load(path, columns, filter={"column": "model", "equals": "a"}))
    assert (error.line, error.field) == (1, "model")


CSV_ROW_ERRORS = [
    ("10,ChatGPT,many,5,0,x", "Request tokens", "not an integer: 'many'"),
    ("10,ChatGPT,12,-5,0,x", "Response tokens", "must not be negative, got '-5'"),
    ("10,ChatGPT,0,5,0,x", "Request tokens", "must be >= 1, got '0'"),
    ("10,ChatGPT,12,,0,x", "Response tokens", "not an integer: ''"),
    ("soon,ChatGPT,12,5,0,x", "Timestamp", "not a finite number: 'soon'"),
    ("inf,ChatGPT,12,5,0,x", "Timestamp", "not a finite number: 'inf'"),
    (
        "4,ChatGPT,12,5,0,x",
        "Timestamp",
        "timestamps must not decrease: '4' is earlier than line 2's",
    ),
    ("10,ChatGPT,12,0,0,x", "Response tokens", "must be >= 1, got 0 (zero_output='clamp'"),
]


@pytest.mark.parametrize(("row", "column", "message"), CSV_ROW_ERRORS)
def test_bad_values_name_file_line_column_and_value(
    tmp_path: Path, row: str, column: str, message: str
) -> None:
    path = write(tmp_path, "b.csv", BURST_HEADER + "5,ChatGPT,472,18,490,x\n" + row + "\n")
    error = trace_error(load(path))
    assert (error.path, error.line, error.field) == (str(path), 3, column)
    assert str(error).startswith(f"{path}:3: {column}: {message}")


@pytest.mark.parametrize(
    ("columns", "row", "column", "message"),
    [
        (
            {"gap": "t", "time_unit": "ms"},
            {"t": -2, "p": 5, "o": 1},
            "t",
            "a gap must not be negative, got -2",
        ),
        (
            {"time": "t", "time_unit": "datetime"},
            {"t": 5, "p": 5, "o": 1},
            "t",
            "not an ISO-8601 datetime like",
        ),
        (
            {"time": "t", "time_unit": "datetime"},
            {"t": "2024-02-30T00:00:00", "p": 5, "o": 1},
            "t",
            "'2024-02-30T00:00:00'",
        ),
        (
            {"time": "t", "time_unit": "s"},
            {"t": True, "p": 5, "o": 1},
            "t",
            "not a finite number: True",
        ),
        ({"time": "t", "time_unit": "s"}, {"t": 3, "p": "5", "o": 1.5}, "o", "not an integer: 1.5"),
        (
            {"time": "t", "time_unit": "s", "hash_ids": "h"},
            {"t": 3, "p": 5, "o": 1, "h": [1, 2]},
            "h",
            "2 ids for a prompt of 1 blocks",
        ),
        (
            {"time": "t", "time_unit": "s", "hash_ids": "h"},
            {"t": 3, "p": 5, "o": 1, "h": "1 2"},
            "h",
            "must be a JSON list of ints such as [1, 2, 3], got '1 2'",
        ),
        (
            {"time": "t", "time_unit": "s", "hash_ids": "h"},
            {"t": 3, "p": 5, "o": 1, "h": [-1]},
            "h",
            "ids must be ints in [0, 2**64), got -1",
        ),
    ],
)
def test_bad_json_values(
    tmp_path: Path, columns: dict[str, str], row: dict[str, object], column: str, message: str
) -> None:
    stamp = "2024-01-01T00:00:00" if columns["time_unit"] == "datetime" else 2
    good = {"t": stamp, "p": 5, "o": 1, "h": [0]}
    mapping = {"input_tokens": "p", "output_tokens": "o", **columns}
    options = {"hash_block_size": 16} if "hash_ids" in columns else {}
    path = jsonl(tmp_path, [good, row])
    error = trace_error(load(path, mapping, **options))
    assert (error.line, error.field) == (2, column)
    assert str(error).startswith(f"{path}:2: {column}: ")
    assert message in str(error)


def test_invalid_json_and_empty_files(tmp_path: Path) -> None:
    columns = {"time": "t", "time_unit": "s", "input_tokens": "p", "output_tokens": "o"}
    error = trace_error(load(jsonl(tmp_path, [{"t": 0, "p": 1, "o": 1}, "{oops"]), columns))
    assert error.line == 2
    assert "invalid JSON" in str(error)
    assert "expected a JSON object" in str(trace_error(load(jsonl(tmp_path, ["[1]"]), columns)))
    assert "empty trace" in str(trace_error(load(jsonl(tmp_path, [""]), columns)))
    assert "empty file: no header row" in str(trace_error(load(write(tmp_path, "e.csv", ""))))
    nothing = load(burst(tmp_path), filter={"column": "Model", "equals": "Claude"})
    assert "empty trace: no requests" in str(trace_error(nothing))


# --- config errors: the key path ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (
            {"columns": {**BURST_COLUMNS, "prompt": "x"}},
            "workload.columns.prompt",
            "unknown key; expected one of 'gap', 'hash_ids', 'input_tokens'",
        ),
        (
            {"columns": {k: v for k, v in BURST_COLUMNS.items() if k != "time_unit"}},
            "workload.columns.time_unit",
            "missing (required, no default); one of 's', 'ms', 'us', 'ns', 'datetime'",
        ),
        (
            {"columns": {**BURST_COLUMNS, "time_unit": "min"}},
            "workload.columns.time_unit",
            "unknown value 'min'; expected one of 'datetime', 'ms', 'ns', 's', 'us'",
        ),
        (
            {"columns": {k: v for k, v in BURST_COLUMNS.items() if k != "time"}},
            "workload.columns.time",
            "missing: map the arrival time column",
        ),
        (
            {"columns": {**BURST_COLUMNS, "gap": "x"}},
            "workload.columns.gap",
            "cannot be combined with time='Timestamp'",
        ),
        (
            {"columns": {**BURST_COLUMNS, "input_tokens": 3}},
            "workload.columns.input_tokens",
            "must be a column name, got 3",
        ),
        (
            {
                "columns": {
                    "gap": "g",
                    "time_unit": "datetime",
                    "input_tokens": "a",
                    "output_tokens": "b",
                }
            },
            "workload.columns.time_unit",
            "'datetime' applies to time, not to gap",
        ),
        ({"columns": "Timestamp"}, "workload.columns", "must be a table (mapping), got str"),
        ({"columns": None}, "workload.columns", "must be a table"),
        (
            {"filter": {"column": "Model", "equal": "x"}},
            "workload.filter.equal",
            "unknown key; expected one of 'column', 'equals', 'in', 'not_in'",
        ),
        (
            {"filter": {"column": "Model", "equals": "x", "in": ["y"]}},
            "workload.filter",
            "give exactly one of 'equals', 'in', 'not_in', got 'equals', 'in'",
        ),
        ({"filter": {"column": "Model"}}, "workload.filter", "got none"),
        ({"filter": {"equals": "x"}}, "workload.filter.column", "missing (required)"),
        (
            {"filter": {"column": "", "equals": "x"}},
            "workload.filter.column",
            "must be a column name, got ''",
        ),
        (
            {"filter": {"column": "Model", "in": "ChatGPT"}},
            "workload.filter.in",
            "must be a non-empty list of strings or ints, got 'ChatGPT'",
        ),
        (
            {"filter": {"column": "Model", "not_in": []}},
            "workload.filter.not_in",
            "must be a non-empty list",
        ),
        (
            {"filter": {"column": "Model", "equals": 1.5}},
            "workload.filter.equals",
            "must be a string or an int, got 1.5",
        ),
        (
            {"filter": [{"column": "Model", "equals": "x"}, {"column": "Model", "in": [True]}]},
            "workload.filter[1].in",
            "got [True]",
        ),
        (
            {"filter": "Model=x"},
            "workload.filter",
            "must be a table or a list of tables, got 'Model=x'",
        ),
        (
            {"hash_block_size": 16},
            "workload.hash_block_size",
            "does not apply without columns.hash_ids (got 16)",
        ),
        (
            {"columns": {**BURST_COLUMNS, "hash_ids": "h"}},
            "workload.hash_block_size",
            "missing: columns.hash_ids is mapped",
        ),
        (
            {"columns": {**BURST_COLUMNS, "hash_ids": "h"}, "hash_block_size": 0},
            "workload.hash_block_size",
            "must be an int in [1, 4294967295], got 0",
        ),
        (
            {"file_format": "parquet"},
            "workload.file_format",
            "unknown value 'parquet'; expected one of 'csv', 'jsonl', 'tsv'",
        ),
        ({"limit": 0}, "workload.limit", "must be an int in [1, 100000000]"),
        ({"time_unit": "s"}, "workload.time_unit", "unknown key for format='columns'"),
    ],
)
def test_config_errors_name_the_key_path(
    tmp_path: Path, change: dict[str, object], field: str, message: str
) -> None:
    error = config_error({**spec(burst(tmp_path)), **change})
    assert error.field == field
    assert str(error).startswith(f"{field}: ")
    assert message in str(error)


def test_missing_columns_table_and_unknown_suffix(tmp_path: Path) -> None:
    missing = {k: v for k, v in spec(burst(tmp_path)).items() if k != "columns"}
    assert str(config_error(missing)) == "workload.columns: missing (required)"
    error = config_error(spec(burst(tmp_path, "b.log")))
    assert error.field == "workload.file_format"
    assert "cannot tell the file type from the name 'b.log'" in str(error)
