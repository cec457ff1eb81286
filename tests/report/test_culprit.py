"""The culprit of a cell and the check a CI runs, on summary rows built here."""

from __future__ import annotations

from audioparity.report.culprit import (
    SEPARATOR,
    check,
    culprit,
    culprits,
    disagreement,
    spreads,
)


def row(stage: str, status: str = "pass", reason: str = "", **labels) -> dict:
    return {"family": "parakeet_tdt", "model": "tiny", "case": "clip", "candidate": "a",
            "backend": "cpu", "weight_type": "f32", "against": "reference", "stage": stage,
            "status": status, "reason": reason, **labels}


def test_a_block_that_is_wrong_is_named_by_its_own_form():
    rows = [row("mel_features"), row("layer_0"), row("layer_0_isolated"),
            row("layer_2", "fail", "nmse 2e-3 > 1e-8"), row("layer_2_isolated"),
            row("layer_1", "fail", "nmse 1e-2 > 1e-8"),
            row("layer_1_isolated", "fail", "nmse 1.5e-2 > 1e-11"), row("enc_out", "fail")]
    assert culprit(rows) == "layer_1_isolated (fail, its own error): nmse 1.5e-2 > 1e-11"


def test_a_stage_that_fails_where_its_inputs_and_its_own_form_pass_is_the_end_to_end_paths():
    """A mask only the end-to-end path builds: layer_1 fails, layer_0 and pos_emb (its inputs)
    pass, and so does layer_1 alone on the reference's input."""
    rows = [row("pos_emb"), row("layer_0"), row("layer_1", "fail", "nmse 2e-8 > 1e-8"),
            row("layer_1_isolated"), row("layer_2", "fail", "nmse 1e-7 > 1e-8"),
            row("layer_2_isolated")]
    assert culprit(rows) == ("layer_1 (fail, end to end only: its inputs pass and "
                             "layer_1_isolated passes): nmse 2e-8 > 1e-8")
    # with an input failing, what it computes from is named upstream, not the stage
    rows = [row("mel_features"), row("pre_encode", "fail", "nmse 1e-6"), row("pos_emb"),
            row("layer_0", "fail", "nmse 1e-6"), row("layer_0_isolated")]
    assert culprit(rows) == ("pre_encode (fail, its inputs pass; no isolated form to tell "
                             "its own error): nmse 1e-6")


def test_every_culprit_is_named_in_data_flow_order():
    """Two faults in one cell (the subsampling and layer 2's block): both named, the
    subsampling first; the layers between, fed by it, are not."""
    rows = [row("mel_features"), row("pre_encode", "fail", "a"), row("pos_emb"),
            row("layer_0", "fail"), row("layer_0_isolated"), row("layer_1", "fail"),
            row("layer_1_isolated"), row("layer_2", "fail"),
            row("layer_2_isolated", "fail", "b"), row("enc_out", "fail")]
    assert culprit(rows).split(SEPARATOR) == [
        "pre_encode (fail, its inputs pass; no isolated form to tell its own error): a",
        "layer_2_isolated (fail, its own error): b"]
    code, lines = check(rows)
    assert code == 1 and lines[:2] == [
        "parakeet_tdt/tiny/clip/a/cpu/f32: pre_encode (fail, its inputs pass; no isolated form "
        "to tell its own error): a",
        "parakeet_tdt/tiny/clip/a/cpu/f32: layer_2_isolated (fail, its own error): b"]


def test_a_prediction_network_fault_is_named_at_its_own_stage_not_at_the_joint():
    """The joint and the decode are computed through the prediction network: its own stage
    (lstm_state_0, after joint_logits in the contract's order) is the culprit."""
    rows = [row("enc_out"), row("joint_logits", "fail", "nmse 1e-6"),
            row("lstm_state_0", "fail", "nmse 1e-3"), row("decode", "fail", "token_match 0.5"),
            row("decoder_replay", "fail", "token_match 0.5")]
    assert culprit(rows) == "lstm_state_0 (fail): nmse 1e-3"
    # the joint wrong on its own, the decode parting by it
    rows[2] = row("lstm_state_0")
    assert culprit(rows) == "joint_logits (fail): nmse 1e-6"


def test_a_family_this_install_does_not_know_reads_its_stages_as_a_chain():
    rows = [row("a"), row("b", "fail", "x"), row("b_isolated"), row("c", "fail"),
            row("d", "fail", "y"), row("d_isolated", "fail", "z")]
    rows = [{**r, "family": "elsewhere"} for r in rows]
    assert culprit(rows).split(SEPARATOR) == [
        "b (fail, end to end only: its inputs pass and b_isolated passes): x",
        "d_isolated (fail, its own error): z"]


def test_crashes_are_named_and_declared_failures_are_not():
    rows = [row("decode", "missing", "not computed"), row("mel_features", "fail", "nmse 1"),
            row("joint_logits", "crashed", "SIGABRT")]
    assert culprit(rows) == "mel_features (fail): nmse 1 || joint_logits (crashed): SIGABRT"
    assert culprit([row("mel_features"), row("joint_logits", "crashed", "SIGABRT"),
                    row("decode", "missing")]) == "joint_logits (crashed): SIGABRT"
    assert culprit([row("mel_features"), row("decode", "xfail", "declared")]) == ""


def test_a_crash_is_the_culprit_not_the_stages_it_left_uncomputed():
    """Our port crashed in pos_emb (a positional table it could not build): the stages after
    it and the isolated forms it owed are missing; the crash is named, once, at its stage."""
    reason = "not computed: the dump crashed in pos_emb (exit code -6)"
    rows = [row("mel_features"), row("pre_encode"), row("pos_emb", "crashed", "exit code -6"),
            row("layer_0", "missing", reason), row("layer_0_isolated", "missing", reason),
            row("enc_out", "missing", reason)]
    assert culprit(rows) == "pos_emb (crashed): exit code -6"
    # without a crash, a local form that is missing says neither "its own error" nor
    # "end to end only"
    assert culprit([row("layer_1", "fail", "nmse 1"), row("layer_1_isolated", "missing")]) == (
        "layer_1 (fail): nmse 1")


def test_check_fails_on_the_reference_comparisons_only():
    clean = [row("mel_features"), row("decode", "xfail")]
    code, lines = check(clean)
    assert code == 0 and lines[-1].endswith("all 1 cells pass, or fail as declared, or are "
                                            "unavailable")
    backend = [row("layer_0", "fail", "nmse 1e-6", backend="vulkan", against="cpu")]
    code, lines = check(clean + backend)
    assert code == 0 and "against cpu (not failing the check)" in lines[0]
    code, lines = check(clean + [row("layer_0", "fail", "nmse 1e-6", weight_type="q8_0")])
    assert code == 1
    assert lines[0] == "parakeet_tdt/tiny/clip/a/cpu/q8_0: layer_0 (fail): nmse 1e-6"
    assert lines[-1] == "audioparity check: 1 of 2 cells need attention"


def spread_row(stage: str, status: str = "fail", **metrics) -> dict:
    """Another reference (nemo-2.4.1) against the primary (nemo), on the same case."""
    labels = {"candidate": "nemo-2.4.1", "backend": "torch", "against": "nemo"}
    return row(stage, status, metrics.pop("reason", ""), **{**labels, **metrics})


GATE = "default/pre_encode*: cosine>=0.99999, nmse<=5e-10, max_rel<=5e-05"
CELL_KEY = ("parakeet_tdt", "tiny", "clip", "a", "cpu", "f32", "reference")


def test_a_stage_closer_to_a_reference_that_parts_there_is_a_reference_disagreement():
    """The references part at pre_encode (declared why) and agree on the mel; the candidate
    fails pre_encode and is closer to nemo-2.4.1 there: its culprit is the disagreement, with
    the figure and the declared cause, and its cell is still not passed by the check."""
    spread = spread_row("pre_encode", "xfail", nmse=3.4e-4,
                        reason="expected (NeMo 3.0 masks padded frames): nmse 3.4e-4 > 5e-10")
    cell = [row("mel_features"),
            row("pre_encode", "fail", "nmse 2e-4 > 5e-10", gate=GATE, nmse=2e-4,
                closer_to="nemo-2.4.1"),
            row("layer_0", "fail", "nmse 1e-3 > 2e-9"), row("enc_out", "fail", "nmse 1e-3 > 2e-9")]
    rows = [spread, *cell]
    text = culprits(rows)[CELL_KEY]
    assert text.startswith("pre_encode (fail, reference disagreement: closer to nemo-2.4.1 "
                           "than to nemo here; nemo-2.4.1 parts from nemo here by nmse "
                           "0.00034; expected (NeMo 3.0 masks padded frames)"), text
    assert check(rows)[0] == 1
    # not closer to it: the candidate's own error, however far the references part
    cell[1] = {**cell[1], "closer_to": ""}
    assert culprits([spread, *cell])[CELL_KEY] == (
        "pre_encode (fail, its inputs pass; no isolated form to tell its own error): "
        "nmse 2e-4 > 5e-10")


def test_a_port_s_own_mel_fault_is_not_excused_by_a_reference_whose_frames_differ():
    """A planted fault of the class a port's mel fault was once excused by: nemo-2.4.1 keeps
    one frame more than the primary (its mel fails on the frame count, declared), and the
    candidate's mel is 1e-10 from the primary with the primary's frame count. Against
    nemo-2.4.1 it cannot even be measured (closer_to empty): the fault is the port's."""
    spread = spread_row("mel_features", "xfail",
                        reason="expected (NeMo 2.5 changed the preprocessor): frames: 310 "
                               "(candidate) != 309 (reference)")
    cell = [row("mel_features", "fail", "nmse 1.06e-10 > 1e-12", nmse=1.06e-10, closer_to=""),
            row("pre_encode", "fail", "nmse 1e-9 > 5e-10")]
    assert culprits([spread, *cell])[CELL_KEY] == "mel_features (fail): nmse 1.06e-10 > 1e-12"


def test_a_difference_another_reference_inherits_from_upstream_excuses_nothing():
    """A planted fault of the class a mask fault of our port was once excused by: nemo-2.4.1
    parts from pre_encode on (declared), so its layer_0 differs too; our port's pre_encode is
    the primary's (not closer to nemo-2.4.1) and its layer_0 fails by a mask fault. Even where
    that fault happens to land nearer nemo-2.4.1's layer_0, the reference's difference there is
    inherited from a pre_encode the port does not share: the fault is the port's."""
    rows = [spread_row("pre_encode", "xfail", nmse=3.4e-4, reason="expected (masked frames)"),
            spread_row("layer_0", "xfail", nmse=2e-3, reason="expected (masked frames)"),
            row("mel_features"), row("pre_encode", nmse=1e-14, closer_to=""), row("pos_emb"),
            row("layer_0", "fail", "nmse 2.15e-4 > 2e-9", nmse=2.15e-4, closer_to="nemo-2.4.1"),
            row("layer_0_isolated")]
    assert culprits(rows)[CELL_KEY] == (
        "layer_0 (fail, end to end only: its inputs pass and layer_0_isolated passes): "
        "nmse 2.15e-4 > 2e-9")
    # a port that shares the upstream difference (closer there too) is excused, saying where
    rows[3] = row("pre_encode", "fail", "nmse 3e-4 > 5e-10", nmse=3e-4, closer_to="nemo-2.4.1")
    text = culprits(rows)[CELL_KEY]
    assert text.startswith("pre_encode (fail, reference disagreement: closer to nemo-2.4.1"), text
    by_stage = {r["stage"]: r for r in rows[2:]}
    from audioparity.models.registry import spec_of

    flow = spec_of("parakeet_tdt").flow(list(by_stage))
    layer = disagreement(by_stage["layer_0"], by_stage, flow, spreads(rows))
    assert layer.startswith("reference disagreement: closer to nemo-2.4.1 than to nemo "
                            "here and on pre_encode, where it parts too"), layer


def test_a_port_bug_where_the_references_agree_stays_the_ports():
    """The references agree at layer_1 (its spread row passes): a candidate failing there is
    named as before, and no spread on another stage excuses it."""
    rows = [spread_row("layer_1", "pass", nmse=1e-13), spread_row("pre_encode", nmse=3.4e-4),
            row("layer_1", "fail", "nmse 1e-3 > 2e-9", gate="default/layer_*: nmse<=2e-09",
                nmse=1e-3, closer_to="nemo-2.4.1"),
            row("layer_1_isolated", "fail", "nmse 1e-3 > 5e-12", closer_to="nemo-2.4.1")]
    assert culprit(rows[2:], spreads(rows)) == (
        "layer_1_isolated (fail, its own error): nmse 1e-3 > 5e-12")


def test_a_blocks_own_error_is_excused_only_where_the_reference_agrees_before_it():
    """On a case where the references part from pre_encode on, their layer_1 spread is what
    accumulated before it: a candidate's layer_1 block wrong on its own stays the port's, even
    closer to that reference; at pre_encode, the first stage they part at, the replayed block
    is excused."""
    spread = spreads([spread_row("pre_encode", nmse=3.4e-4), spread_row("layer_1", nmse=1e-3)])
    by_stage: dict = {}
    flow = {"pre_encode": (("mel_features",), ()), "layer_1": (("pre_encode",), ()),
            "mel_features": ((), ())}
    own = row("layer_1_isolated", "fail", nmse=1e-6, closer_to="nemo-2.4.1")
    assert disagreement(own, by_stage, flow, spread) == ""
    replayed = row("pre_encode_replayed", "fail", gate=GATE, nmse=3e-4, closer_to="nemo-2.4.1")
    assert disagreement(replayed, by_stage, flow, spread).startswith(
        "reference disagreement: closer to nemo-2.4.1")
    # another reference parting from the mel on is no reason to refuse that one's own spread
    spread = spreads([spread_row("pre_encode", nmse=3.4e-4),
                      spread_row("mel_features", nmse=1e-5, candidate="older")])
    assert disagreement(replayed, by_stage, flow, spread).startswith(
        "reference disagreement: closer to nemo-2.4.1")
    # a passing row is never called a disagreement
    assert disagreement({**replayed, "status": "pass"}, by_stage, flow, spread) == ""


def test_a_decode_alone_is_excused_by_the_decode_saying_what_is_not_exposed():
    """A port exposing only its decode (whisper.cpp): closer to nemo-2.4.1 there, which parts
    from the primary from the mel on; the stages before it are not exposed, and the culprit
    says so."""
    rows = [spread_row("mel_features", "xfail", reason="expected (frames)"),
            spread_row("enc_out", "xfail", nmse=3.6e-3, reason="expected (NeMo 2.5)"),
            spread_row("decode", "xfail", token_match=0.75, reason="expected (NeMo 2.5)"),
            row("mel_features", "unavailable"), row("enc_out", "unavailable"),
            row("decode", "fail", "wer 0.2 > 0.0", token_match=0.75, closer_to="nemo-2.4.1")]
    text = culprits(rows)[CELL_KEY]
    assert text.startswith("decode (fail, reference disagreement: closer to nemo-2.4.1 than "
                           "to nemo here (enc_out, where it parts too, not exposed); nemo-2.4.1 "
                           "parts from nemo here by token_match 0.75"), text


def test_a_declared_difference_that_no_longer_holds_is_no_spread():
    """A reference's stale declaration fails its row, but the references agree there."""
    stale = spread_row("pre_encode", nmse=1e-14,
                       reason="declared expected failure passed (stale declaration: why)")
    assert spreads([stale]) == {}


def test_a_recipe_that_misses_its_targets_is_named_only_where_nothing_else_explains_it():
    """The row `recipe` judges the cell's own stages against float32: a fault upstream (the
    prediction network's state) explains a missed target and is named instead; where every
    stage passes, the recipe itself misses its targets, and it is named."""
    missed = "not verified: decode of clip: wer 0.2 > 0"
    faulty = [row("enc_out"), row("lstm_state_0", "fail", "nmse 1e-2 > 1e-12"),
              row("joint_logits", "fail"), row("decode", "fail", "wer 0.2 > 0"),
              row("recipe", "fail", missed)]
    assert culprit(faulty) == "lstm_state_0 (fail): nmse 1e-2 > 1e-12"
    clean = [row("enc_out"), row("lstm_state_0"), row("joint_logits"), row("decode"),
             row("recipe", "fail", missed)]
    assert culprit(clean) == f"recipe (fail): {missed}"
    assert culprit([*clean[:-1], row("recipe")]) == ""
    # a failure declared elsewhere in the cell does not excuse the missed target
    declared = [row("enc_out", "xfail", "declared"), *clean[1:]]
    assert culprit(declared) == f"recipe (fail): {missed}"
    assert check(declared)[0] == 1


def test_a_reference_s_culprits_follow_its_own_data_flow():
    """A planted converter fault in another reference (transformers' layer 1 conv norm weight
    and bias swapped): its layer_1 parts from the primary, and so does everything after it,
    its joint rows on another greedy path (another frame count) among them. A reference's joint
    is computed from its own enc_out (a candidate's, teacher-forced, from the primary's): the
    fault upstream is the one culprit, not a joint_logits listed before it."""
    def ref(stage: str, status: str = "pass", reason: str = "") -> dict:
        return row(stage, status, reason, candidate="transformers", backend="torch",
                   against="nemo")

    frames = "frames: 16 (candidate) != 14 (reference)"
    rows = [ref("mel_features"), ref("pre_encode"), ref("pos_emb"), ref("layer_0"),
            ref("layer_1", "fail", "nmse 0.41 > 2e-09"), ref("enc_out", "fail", "nmse 0.39"),
            ref("joint_logits", "fail", frames), ref("lstm_state_0"),
            ref("decode", "fail", "wer 0.5 > 0.0"), ref("decode_logits", "fail", frames)]
    layer = ("layer_1 (fail, its inputs pass; no isolated form to tell its own error): "
             "nmse 0.41 > 2e-09")
    assert culprit(rows) == layer
    code, lines = check(rows)
    assert code == 0 and lines[:-1] == [
        f"parakeet_tdt/tiny/clip/transformers/torch/f32 against nemo (not failing the check): "
        f"{layer}"]
    # with the encoders agreeing, the joint is the reference's own difference; the decode
    # that follows it is not named apart
    rows = [r if r["stage"] not in ("layer_1", "enc_out") else ref(r["stage"]) for r in rows]
    assert culprit(rows) == ("joint_logits (fail, its inputs pass; no isolated form to tell "
                             f"its own error): {frames}")
    # a candidate's joint, computed from the primary's enc_out, is its own still
    cell = [row("layer_1", "fail", "nmse 1e-3"), row("layer_1_isolated", "fail", "nmse 1e-3"),
            row("enc_out", "fail"), row("joint_logits", "fail", "nmse 1e-6"),
            row("lstm_state_0")]
    assert sorted(culprit(cell).split(SEPARATOR)) == [
        "joint_logits (fail): nmse 1e-6", "layer_1_isolated (fail, its own error): nmse 1e-3"]
