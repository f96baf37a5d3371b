"""`structgen check-schema`, `structgen maskbench` and `structgen walkbench` through the real console entry point."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from service.cli import main
from tests.conftest import TOKENIZERS

CASES = Path(__file__).parent / "maskbench_cases"


@pytest.mark.parametrize("args", [
    ["maskbench", "/no/such/cases"], ["walkbench", "/no/such/cases"],
    ["maskbench", str(CASES), "--json", "/no/such/dir/out.jsonl"],
    ["check-schema", str(CASES / "Github_trivial" / "o10018.json"), "--tokenizer", "/no/such/tokenizer"],
    ["check-schema", "/no/such/schema.json"],
])
def test_a_path_that_is_not_there_is_a_one_line_error_before_any_work(args, capsys):
    """A wrong cases folder ran over no case (`cases=0`, exit status 0); a wrong `--json` folder failed with a
    traceback after the whole run; a tokenizer path that is none was read as a hub id, with a traceback; a schema
    file that is not there was "not supported" (exit status 1, as a schema refused)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and "/no/such/" in capsys.readouterr().err


def test_a_json_path_that_is_a_directory_is_refused_before_any_work(tmp_path, capsys):
    """It passed the check (its parent is a folder), and the run failed writing it at the end, with a traceback."""
    with pytest.raises(SystemExit) as exc:
        main(["maskbench", str(CASES), "--json", str(tmp_path)])
    assert exc.value.code == 2 and "is a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["check-schema", str(tmp_path)])
    assert exc.value.code == 2 and f"{tmp_path} is a directory; name a file" in capsys.readouterr().err


def test_maskbench_prints_the_exact_summary_line_and_json(tmp_path, capsys):
    for name in ("Github_trivial", "BFCL"):
        (tmp_path / name).mkdir()
        for p in sorted((CASES / name).glob("*.json"))[:3]:
            shutil.copy(p, tmp_path / name / p.name)
    out = tmp_path / "out.jsonl"
    assert main(["maskbench", str(tmp_path), "--tokenizer", str(TOKENIZERS["gpt2"]), "--backend", "llguidance",
                 "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    last = lines[-1]
    assert any(re.fullmatch(r"compiled=\d+ errors=\d+ compile_p50_ms=[\d.]+ compile_p90_ms=[\d.]+ "
                            r"mask_mean_us=[\d.]+", line) for line in lines), lines
    assert re.fullmatch(r"maskbench: cases=6 compiled=\d+ valid_rejected=0/\d+ invalid_accepted=0/\d+ "
                        r"compile_p50_ms=[\d.]+ mask_mean_us=[\d.]+", last), last
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and set(rows[0]) == {"case", "compiled", "backend", "error", "compile_ms", "valid_n",
                                               "valid_accepted", "invalid_n", "invalid_rejected", "mask_us_mean"}


@pytest.mark.parametrize("args", [["maskbench", str(CASES), "--limit", "-1"], ["walkbench", str(CASES), "--walks", "0"],
                                  ["walkbench", str(CASES), "--max-tokens", "-5"],
                                  ["maskbench", str(CASES), "--timeout", "-1"]])
def test_counts_and_times_out_of_range_are_a_one_line_error(args, capsys):
    """A negative `--limit` silently left cases out, `--walks 0` walked nothing, a negative `--timeout` was taken."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and "must be" in capsys.readouterr().err


def test_maskbench_limit_zero_runs_no_case_and_a_stray_file_is_a_case_in_error(tmp_path, capsys):
    """`--limit 0` ran every case (walkbench ran none); a `.json` file that is no case (an earlier `--json` saved
    so) ended the whole run with a traceback, writing nothing."""
    (tmp_path / "cases").mkdir()
    shutil.copy(sorted((CASES / "Github_trivial").glob("*.json"))[0], tmp_path / "cases" / "a.json")
    (tmp_path / "cases" / "b.json").write_text('{"case": "a.json", "compiled": true}\n{"case": "x"}\n')
    (tmp_path / "cases" / "c.json").write_text('{"schema": {"type": "string"}, "tests": [{"data": "x"}]}')
    assert main(["maskbench", str(tmp_path / "cases"), "--limit", "0", "--tokenizer", str(TOKENIZERS["gpt2"]),
                 "--backend", "llguidance"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("maskbench: cases=0 ")
    out = tmp_path / "out.jsonl"
    assert main(["maskbench", str(tmp_path / "cases"), "--tokenizer", str(TOKENIZERS["gpt2"]),
                 "--backend", "llguidance", "--json", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("maskbench: cases=3 compiled=1 ")
    rows = {row["case"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["b.json"]["error"].startswith("not a MaskBench case") and rows["a.json"]["compiled"]
    assert rows["c.json"]["error"].startswith("not a MaskBench case")


def test_maskbench_sets_llguidance_up_before_the_first_case(monkeypatch, capsys):
    """llguidance's tokenizer set-up (~2-4 s, once) was counted as the first case's compile time: `--limit 2`
    printed a compile p50 of 4346 ms. It is built before any case is timed."""
    from constrain import maskbench

    ready = []
    run_case = maskbench.run_case

    def watched(path, root, compiler, tokenizer):
        ready.append(compiler._lltok is not None)
        return run_case(path, root, compiler, tokenizer)

    monkeypatch.setattr(maskbench, "run_case", watched)
    assert main(["maskbench", str(CASES / "Github_trivial"), "--limit", "2", "--tokenizer", str(TOKENIZERS["gpt2"]),
                 "--backend", "llguidance"]) == 0
    assert ready == [True, True]


def test_walkbench_prints_invalid_documents_and_a_summary_line(tmp_path, capsys):
    (tmp_path / "cases").mkdir()
    for p in sorted((CASES / "Github_trivial").glob("*.json"))[:3]:
        shutil.copy(p, tmp_path / "cases" / p.name)
    # a case whose grammar is fine but whose walks we can judge: a date the old llguidance format let be 0000
    (tmp_path / "cases" / "date.json").write_text(json.dumps({"schema": {
        "type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"],
        "additionalProperties": False}, "tests": []}))
    out = tmp_path / "out.jsonl"
    assert main(["walkbench", str(tmp_path / "cases"), "--tokenizer", str(TOKENIZERS["gpt2"]), "--backend",
                 "llguidance", "--walks", "4", "--max-tokens", "40", "--json", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.fullmatch(r"walkbench: cases=4 compiled=4 walks=16 ended=(\d+) invalid=0 escaped_keys=0 gave_up=0 named=0",
                     last)
    assert m and int(m.group(1)) >= 8, last
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and set(rows[0]) == {"case", "compiled", "walks", "ended", "gave_up", "invalid",
                                               "escaped_keys", "named"}


def test_check_schema_reads_a_schema_from_a_pipe(capsys):
    """`... | structgen check-schema /dev/stdin` (or `<(...)`): a pipe is no regular file, and it was refused as "no
    such file" once the path was checked (review of f5bce64, R8)."""
    import os

    read, write = os.pipe()
    os.write(write, json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}).encode())
    os.close(write)
    try:
        code = main(["check-schema", f"/proc/self/fd/{read}"])
    finally:
        os.close(read)
    assert code == 0 and "supported" in capsys.readouterr().out


def test_check_schema_reports_backend_and_unsupported_pointers(tmp_path, capsys):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"type": "string", "not": {"pattern": "(a)\\1"}}))
    assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"])]) == 0
    out = capsys.readouterr().out
    assert "supported by llguidance" in out and "/not" in out
    assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"]), "--strict"]) == 1


def test_check_schema_reports_the_compile_apart_from_the_set_up_a_server_pays_once(tmp_path, capsys, monkeypatch):
    """The compile time printed held ~2 s of llguidance's tokenizer set-up (the README's table reads 59 ms for
    person.json, check-schema read 2,081 ms): here the set-up is made to take at least three seconds (half a
    second made the comparison depend on how fast a loaded machine compiles `{"type": "integer"}`; a set-up
    counted in the compile time still reads 3,000 ms or more)."""
    import time

    from constrain import compiler

    real = compiler.build_lltokenizer
    monkeypatch.setattr(compiler, "build_lltokenizer", lambda *a: time.sleep(3.0) or real(*a))
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"type": "integer"}))
    assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"]), "--backend", "llguidance"]) == 0
    out = capsys.readouterr().out
    set_up = float(re.search(r"set-up ([0-9.]+) ms", out).group(1))
    compile_ms = float(re.search(r"compile ([0-9.]+) ms", out).group(1))
    assert set_up >= 3000 > compile_ms


def test_maskbench_groups_compile_errors_by_cause():
    from constrain.maskbench import error_class

    assert error_class("strict schema uses a keyword that cannot be enforced at /properties/a/not (not)") \
        == "keyword not"
    assert error_class("cannot compile constraint: oneOf constraints are not supported. Enable 'coerce_one_of'") \
        == "oneOf not provably disjoint"
    assert error_class("invalid JSON Schema at /enum: [1, 1] has non-unique elements") == "invalid schema"
    assert error_class("compiling this constraint took longer than 60 s") == "time limit"
    assert error_class("something new").startswith("other: ")


def test_check_schema_names_the_unique_items_enforced_while_decoding(tmp_path, capsys):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}, "required": ["tags"],
        "additionalProperties": False}))
    assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"]), "--strict",
                 "--backend", "llguidance"]) == 0
    out = capsys.readouterr().out
    assert "enforced while decoding: /properties/tags/uniqueItems" in out
    assert "outlines: exact" in out and "unenforced: none" in out


def test_check_schema_names_the_values_checked_as_they_are_finished(tmp_path, capsys):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"type": "object", "properties": {
        "rows": {"type": "array", "items": {"type": "object"}, "uniqueItems": True},
        "n": {"type": "integer", "not": {"multipleOf": 3}}}}))
    assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"]), "--strict",
                 "--backend", "llguidance"]) == 0
    out = capsys.readouterr().out
    assert "checked as each value is finished: /properties/n, /properties/rows" in out
    assert "unenforced: none" in out


def test_check_schema_says_when_keys_are_written_without_unicode_escapes(tmp_path, capsys):
    open_object = tmp_path / "open.json"
    open_object.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}))
    closed = tmp_path / "closed.json"
    closed.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}},
                                  "additionalProperties": False}))
    for f, said in ((open_object, True), (closed, False)):
        assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"]), "--backend", "llguidance"]) == 0
        assert ("keys are written without \\u escapes" in capsys.readouterr().out) == said


def test_check_schema_on_false_says_it_is_unsatisfiable_and_points_at_the_root(tmp_path, capsys):
    f = tmp_path / "false.json"
    f.write_text("false")
    assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"])]) == 1
    out = capsys.readouterr().out
    assert "outlines: cannot enforce the root\n" in out and "/type" not in out
    assert "Unsatisfiable" in out


def test_check_schema_names_what_outlines_cannot_enforce_at_places_in_the_file(tmp_path, capsys):
    """outlines' refusals were printed at places in the schema as rewritten (`/properties/n/allOf/0/anyOf/1/
    exclusiveMaximum` for a `not: {const: 3}`), which the file does not have; the server names the subschema the
    rewrite replaced, and an open object's absent `additionalProperties` at its place (QA readme F4)."""
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"type": "object", "properties": {
        "n": {"not": {"const": 3}}, "o": {"type": "object", "properties": {"a": {"type": "integer"}}}}}))
    main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"]), "--backend", "llguidance"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("outlines: "))
    assert line == "outlines: cannot enforce /additionalProperties, /properties/n, /properties/o/additionalProperties"


def test_check_schema_names_the_values_checked_as_they_are_finished_at_places_in_the_file(tmp_path, capsys):
    """`minProperties` is checked at the object, which the compile wraps in an `allOf`: the line said `/allOf/0`,
    a place the file does not have (QA cli F2)."""
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 2}))
    assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"]), "--strict",
                 "--backend", "llguidance"]) == 0
    assert "checked as each value is finished: the root\n" in capsys.readouterr().out


_TOO_DEEP = "not read: it nests arrays and objects deeper than 500 levels"


@pytest.mark.parametrize("text, reason", [
    ("", "not JSON: Expecting value"), ("a schema", "not JSON: Expecting value"),
    ('{"type": "array", "items": ' * 3000 + "{}" + "}" * 3000, _TOO_DEEP),
    ('{"type": "array", "items": ' * 500 + "{}" + "}" * 500, _TOO_DEEP)])
def test_check_schema_says_a_file_is_not_json_in_one_line(text, reason, tmp_path, capsys):
    """Such a file was "not supported", as a schema the backends refuse, and one nested 3,000 deep ended in a
    RecursionError traceback (QA cli F3, F5). Past 500 levels a file is not read, on any Python (3.12 read 3,000
    levels and said "nesting deeper than 64" where 3.11 said the file was nested too deeply)."""
    f = tmp_path / "s.json"
    f.write_text(text)
    assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"])]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{f}: {reason}") and out.count("\n") == 1, out


def test_check_schema_reads_a_file_with_a_byte_order_mark(tmp_path, capsys):
    """A Windows editor's UTF-8 byte-order mark: "not supported: Unexpected UTF-8 BOM" (QA cli F5)."""
    f = tmp_path / "s.json"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"type": "integer"}).encode())
    assert main(["check-schema", str(f), "--tokenizer", str(TOKENIZERS["gpt2"]), "--backend", "llguidance"]) == 0
    assert f"{f}: supported by llguidance" in capsys.readouterr().out


@pytest.mark.parametrize("depth", [500, 3000])
def test_maskbench_counts_a_case_nested_too_deeply_as_a_case_in_error(depth, tmp_path, capsys):
    """One such case file ended the whole run in a RecursionError traceback, and no `--json` was written. (Past
    500 levels a case is not read, on any Python: 3.12 read 3,000 levels.)"""
    (tmp_path / "deep.json").write_text('{"schema": ' + '{"items": ' * depth + "{}" + "}" * (depth + 1))
    shutil.copy(CASES / "Github_trivial" / "o10018.json", tmp_path / "ok.json")
    out = tmp_path / "out.jsonl"
    assert main(["maskbench", str(tmp_path), "--tokenizer", str(TOKENIZERS["gpt2"]), "--backend", "llguidance",
                 "--json", str(out)]) == 0
    rows = {row["case"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["deep.json"]["error"] == "not a MaskBench case: nests arrays and objects deeper than 500 levels"
    assert not rows["deep.json"]["compiled"]
    assert rows["ok.json"]["compiled"]


def test_a_tokenizer_folder_that_does_not_load_is_a_one_line_error(tmp_path, capsys):
    """Its files are there but do not load: a transformers traceback (QA cli F3)."""
    (tmp_path / "tokenizer.json").write_text("garbage")
    schema = tmp_path / "s.json"
    schema.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        main(["check-schema", str(schema), "--tokenizer", str(tmp_path)])
    assert str(exc.value.code).startswith(f"structgen: cannot load the tokenizer in {tmp_path}: ")


@pytest.mark.parametrize("command, defaults", [
    ("serve", ["--host HOST           address to listen on (default: 127.0.0.1)", "--port PORT (default: 8000)",
               "(default: none, every", "cuda where there is one (default: auto)", "float32 on a CPU (default: auto)",
               "requests decoded together (default: 16)", "README (default: auto)", "(default: info)"]),
    ("walkbench", ["(default: the built-in model's", "default: 60)", "(default: 3)", "(default: 160)"]),
    ("maskbench", ["(default: the built-in model's", "default: 60)"])])
def test_help_states_each_option_s_default(command, defaults, capsys):
    """`serve --help` showed no default for --host, --port, --device, --dtype, --max-batch-size,
    --constraint-backend, --log-level or --api-key, nor the benches theirs (QA cli F6)."""
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0 and all(" ".join(d.split()) in text for d in defaults), text


def test_serve_help_states_the_defaults_the_environment_sets(monkeypatch, capsys):
    """The defaults shown were ServerConfig's where STRUCTGEN_PORT, STRUCTGEN_MAX_BATCH_SIZE or STRUCTGEN_API_KEY
    set others, which the server then used (QA review F6). The key itself is never shown."""
    monkeypatch.setenv("STRUCTGEN_PORT", "9999")
    monkeypatch.setenv("STRUCTGEN_MAX_BATCH_SIZE", "3")
    monkeypatch.setenv("STRUCTGEN_API_KEY", "s3cret-key")
    monkeypatch.setenv("STRUCTGEN_MODEL", "/models/tiny")
    monkeypatch.setenv("STRUCTGEN_MASK_THREADS", "2")
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--port PORT (default: 9999)" in text and "requests decoded together (default: 3)" in text
    assert "(STRUCTGEN_MODEL sets '/models/tiny')" in text and "(STRUCTGEN_MASK_THREADS sets '2')" in text
    assert "(default: the key in STRUCTGEN_API_KEY)" in text and "s3cret-key" not in text


@pytest.mark.parametrize("name, eos", [("qwen2", {151643, 151645}), ("phi3", {32000, 32007}), ("gpt2", {50256})])
def test_the_benches_end_on_the_tokenizer_s_special_stop_tokens_only(name, eos):
    """`</s>` is text in Qwen2's and Phi-3's vocabularies (128247, 2): the benches took it for an end of sequence
    (QA budgetsweep)."""
    from constrain.cli import load_tokenizer

    assert set(load_tokenizer(TOKENIZERS[name])[1].eos_token_ids) == eos
