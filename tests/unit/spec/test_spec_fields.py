"""Single-field parsers: names, exit codes, labels, mounts, env names, URLs, file paths,
quantities and durations."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.quantity import format_bytes, format_duration_s, parse_duration_s, parse_quantity
from trainyard.spec import fields

codes = st.frozensets(st.integers(min_value=0, max_value=255), min_size=1)


@given(codes)
def test_exit_codes_round_trip_through_text(values: frozenset[int]) -> None:
    text = fields.format_exit_codes(values)
    assert fields.parse_exit_codes(text) == values
    assert len(text) <= len(",".join(map(str, sorted(values))))


@given(st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255)), min_size=1, max_size=8))
def test_exit_code_ranges_cover_exactly_their_members(pairs: list[tuple[int, int]]) -> None:
    ranges = [(min(a, b), max(a, b)) for a, b in pairs]
    text = ", ".join(f"{lo}-{hi}" for lo, hi in ranges)
    expected = {c for lo, hi in ranges for c in range(lo, hi + 1)}
    assert fields.parse_exit_codes(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (15, {15}),
        ("0,1-10,16", {0, *range(1, 11), 16}),
        (" 3 , 5 - 6 ", {3, 5, 6}),
        ([1, 2], {1, 2}),
        (frozenset({4}), {4}),
        ("255", {255}),
    ],
)
def test_exit_codes_accept_ints_text_and_lists(value: object, expected: set[int]) -> None:
    assert fields.parse_exit_codes(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("256", "out of range"),
        (300, "out of range"),
        ("10-2", "reversed; write it as 2-10"),
        ("1,,2", "invalid exit code ''"),
        ("a", "invalid exit code 'a'"),
        ("-1", "invalid exit code"),
        (True, "expected exit codes"),
        (None, "expected exit codes"),
        (1.5, "expected exit codes"),
        (["x"], "invalid exit code"),
        ("1-2-3", "invalid exit code"),
    ],
)
def test_bad_exit_codes_say_what_is_wrong(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        fields.parse_exit_codes(value)


@given(st.integers(0, 255))
def test_every_code_in_range_is_accepted_as_int_and_text(code: int) -> None:
    assert fields.parse_exit_codes(code) == fields.parse_exit_codes(str(code)) == {code}


@pytest.mark.parametrize("name", ["a", "task1", "worker_1", "my-task", "A" * 63, "0x"])
def test_good_names(name: str) -> None:
    assert fields.check_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "-a", "a-", "_a", "a b", "tâche", "a" * 64, "a.b", "a/b", "名前"]
)
def test_bad_names_show_the_rule(name: str) -> None:
    with pytest.raises(ValueError, match="ASCII letters, digits"):
        fields.check_name(name)


def test_name_key_treats_case_and_dash_underscore_alike() -> None:
    assert fields.name_key("Worker_1") == fields.name_key("worker-1") == "worker-1"
    assert fields.name_key("a") != fields.name_key("b")


@pytest.mark.parametrize(
    "key", ["team", "app.kubernetes.io/name", "example.com/a_b", "a" * 63, "x.y-z"]
)
def test_good_label_keys(key: str) -> None:
    assert fields.check_label_key(key) == key


@pytest.mark.parametrize("key", ["", "-a", "a" * 64, "Example.com/a", "/a", "a/", "a b", "é"])
def test_bad_label_keys(key: str) -> None:
    with pytest.raises(ValueError, match="label key"):
        fields.check_label_key(key)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"nested": "value"}, "must be a string, got a dict"),
        (3, "must be a string, got a int"),
        (True, "must be a string"),
        ("", "must be non-empty"),
        ("a b", "invalid label value"),
        ("a" * 64, "invalid label value"),
        ("-x", "invalid label value"),
    ],
)
def test_bad_label_values(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        fields.check_label_value(value)


def test_labels_are_limited_to_sixteen() -> None:
    assert fields.check_labels({f"k{i}": "v" for i in range(16)})
    with pytest.raises(ValueError, match="17 labels given; at most 16"):
        fields.check_labels({f"k{i}": "v" for i in range(17)})
    with pytest.raises(ValueError, match="mapping"):
        fields.check_labels(["a"])
    assert fields.check_labels(None) == {}


@pytest.mark.parametrize(
    ("mount", "expected"),
    [
        ("/dev/shm", ("/dev/shm", "/dev/shm")),
        ("/opt:/home/opt", ("/opt", "/home/opt")),
        ("/a/../b/:/c//d", ("/b", "/c/d")),
        ("/with space:/x y", ("/with space", "/x y")),
    ],
)
def test_mounts_split_into_source_and_destination(mount: str, expected: tuple[str, str]) -> None:
    assert fields.split_mount(mount) == expected


@pytest.mark.parametrize(
    ("mount", "reason"),
    [
        ("/opt:/home/foo:/bad_mount", "more than one ':'"),
        ("opt", "absolute"),
        ("/opt:home", "absolute"),
        ("", "absolute"),
        ("/opt:", "absolute"),
    ],
)
def test_bad_mounts(mount: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        fields.split_mount(mount)


@pytest.mark.parametrize("name", ["PATH", "_x", "NCCL_DEBUG", "a1"])
def test_good_env_names(name: str) -> None:
    assert fields.check_env_name(name) == name


@pytest.mark.parametrize("name", ["1A", "A-B", "A B", "", "É"])
def test_bad_env_names(name: str) -> None:
    with pytest.raises(ValueError, match="environment variable name"):
        fields.check_env_name(name)


@pytest.mark.parametrize("url", ["s3://b/p", "file:///tmp/x", "gs://b", "swift://h/a/b"])
def test_good_urls(url: str) -> None:
    assert fields.check_url(url) == url


@pytest.mark.parametrize("url", ["/tmp/x", "b/p", "s3://a b", "://x", ""])
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match="invalid URL"):
        fields.check_url(url)


def test_regex_must_compile() -> None:
    assert fields.check_regex(r".*\.txt$")
    with pytest.raises(ValueError, match="invalid regex '\\(': .*fix the expression"):
        fields.check_regex("(")


@pytest.mark.parametrize("path", ["/tmp/run.sh", "/a b/c d.sh", "/trainyardx/a", "/tmp/ü.txt"])
def test_good_file_paths(path: str) -> None:
    assert fields.check_file_path(path) == path


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("tmp/run.sh", "must be absolute; write it as /tmp/run.sh"),
        ("/trainyard/x", "reserves"),
        ("/trainyard", "reserves"),
        ("/tmp/../trainyard/x", "reserves"),
        ("/dev/x", "inside /dev"),
        ("/proc/self/x", "inside /proc"),
        ("/sys/y", "inside /sys"),
        ("/tmp/", "names a folder"),
        ("/", "names a folder"),
    ],
)
def test_bad_file_paths(path: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        fields.check_file_path(path)


# quantities and durations (trainyard.quantity)


@given(st.integers(min_value=0, max_value=2**62))
def test_byte_counts_in_exact_form_parse_back(count: int) -> None:
    text = format_bytes(count)
    if "." not in text:
        assert parse_quantity(text) == count
    else:
        assert abs(parse_quantity(text) - count) / count <= Decimal(
            "0.05"
        )  # 0.1 of a unit, value >= 1 unit


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("512Mi", 512 * 2**20),
        ("500m", Decimal("0.5")),
        ("2T", 2 * 10**12),
        ("1e3", 1000),
        ("1.5Ki", 1536),
        (".5", Decimal("0.5")),
        (4, 4),
        (0.25, Decimal("0.25")),
    ],
)
def test_quantities(text: object, value: object) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["1GB", "-1", "Gi", "1 Gi", "", "1.2.3", True, -3])
def test_bad_quantities(text: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


@given(st.integers(min_value=0, max_value=10**9))
def test_durations_round_trip(seconds: int) -> None:
    assert parse_duration_s(format_duration_s(seconds)) == seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("8h", 28800), ("2d", 172800), ("90", 90), (45, 45), ("1.5h", 5400)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["1h30m", "5 m", "5M", "1w", "", "-5s", True, -1])
def test_bad_durations_name_the_accepted_forms(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration_s(text)
