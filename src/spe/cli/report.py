"""``spe report``: one Markdown report with the paper's tables and pictures for a set of checkpoints.

Sections (Liutkus et al. 2021): extrapolation (Table 6, Figure 3), positional-encoding
properties (Table 7), learned kernels (Figure 7), attention maps (Figures 8-12), generation
and style similarity (Figure 5), and the R ablation (Figure 14) when test-time R values are
given. Everything lands in one folder: ``report.md``, ``report.json`` (every number), PNGs,
the generated MIDI files and, when FluidSynth and a soundfont are found, WAV renderings.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from spe.cli.main import UsageError, evaluate_checkpoints, generate_midi

__all__ = ["build_report", "pe_metrics", "probe_plan", "probe_tokens", "r_grids"]

log = logging.getLogger("spe")

SPE_POSITIONALS = ("sinespe", "convspe")
SCORE_POSITIONALS = ("shaw", "music-relative", "alibi")
SOUNDFONTS = ("/usr/share/sounds/sf2/FluidR3_GM.sf2", "/usr/share/soundfonts/default.sf2")
# Attention maps are L × L images per head: beyond this many tokens they cost memory, not insight.
MAX_ATTENTION_LENGTH = 1024
PROMPT_BARS = 2
NUM_PARTS = 4


# ---------------------------------------------------------------------------- PE metrics (Table 7)

def probe_plan(seq_len: int) -> dict:
    """Where identical-token probes are scored for a model trained on ``seq_len`` tokens.

    Table 7 trains on 2048 tokens and scores queries in (0, 1024], (1024, 2048] and
    (2048, 2560] with offsets < 128, 512, 1024. Scaled to any training length L we take:

    * probe length L + min(L, 512) (2560 for L = 2048, as the paper);
    * query rows [0, L) (trained positions) and [L, L + min(L, 512)) (extrapolation);
    * offsets < min(64, L) (local) and < min(L, 512) (long range), deduplicated.

    The 512 caps keep monotonicity (O(rows · offsets²) comparisons per head) and the
    (H, length, length) float64 probe affordable for long training lengths.

    Args:
        seq_len: training length L in tokens, >= 2.

    Returns:
        ``{"length": int, "ranges": [(start, stop), ...], "offsets": [max_offset, ...]}``,
        0-based half-open query ranges and largest offsets m − n considered.

    Raises:
        ValueError: if ``seq_len`` < 2 (no two keys to compare).
    """
    if seq_len < 2:
        raise ValueError(f"probing needs a training length of at least 2 tokens, got {seq_len}")
    extra = min(seq_len, 512)
    offsets = sorted({min(64, seq_len), extra})
    return {"length": seq_len + extra, "ranges": [(0, seq_len), (seq_len, seq_len + extra)],
            "offsets": [o - 1 for o in offsets]}


def probe_tokens(vocab_size: int, count: int) -> list[int]:
    """``count`` token ids evenly spaced over [0, vocab_size) (all of them if count >= vocab_size).

    Raises:
        ValueError: if ``count`` < 1.
    """
    if count < 1:
        raise ValueError(f"the number of probe tokens must be at least 1, got {count}")
    return sorted(set(np.rint(np.linspace(0, vocab_size - 1, min(count, vocab_size))).astype(int).tolist()))


def pe_metrics(model, *, seq_len: int, tokens: list[int], progress: bool = False) -> dict:
    """Translation invariance T and monotonicity M of the first layer (appendix D.3, Table 7).

    For each token of ``tokens``, :func:`~spe.metrics.identical_token_attention` gives the
    unnormalised attention of layer 0 on that token repeated ``probe_plan(seq_len)["length"]``
    times; T and M are computed per head for every (query range, offset) pair of
    :func:`probe_plan`, averaged over the tokens, and the best (lowest) head is reported, as in
    Table 7 (T and M may come from different heads).

    Args:
        model: a DecoderLM (score encodings are refused by the probe).
        seq_len: the model's training length in tokens.
        tokens: token ids to probe.
        progress: show a progress bar over tokens.

    Returns:
        ``{"length", "tokens", "columns": [{"query_range", "max_offset", "T": {"best", "head",
        "per_head"}, "M": {...}}]}``; heads are 0-based.

    Raises:
        ValueError: from the probe (score encodings, RoPE with a linear kernel).
    """
    from spe.metrics import identical_token_attention, monotonicity, translation_invariance

    plan = probe_plan(seq_len)
    cells = [(r, o) for r in plan["ranges"] for o in plan["offsets"]]
    num_heads = model.config.num_heads
    metrics = {"T": translation_invariance, "M": monotonicity}
    sums = np.zeros((len(cells), len(metrics), num_heads))  # summed over tokens
    loop = tokens
    if progress:
        from tqdm import tqdm

        loop = tqdm(tokens, desc=f"probe {model.config.positional}", unit="token")
    for token in loop:
        attn = identical_token_attention(model, token, plan["length"], layer=0)  # (H, L, L)
        for c, (query_range, max_offset) in enumerate(cells):
            for m, metric in enumerate(metrics.values()):
                for h in range(num_heads):
                    sums[c, m, h] += metric(attn[h], query_range=query_range, max_offset=max_offset)
    columns = []
    for c, (query_range, max_offset) in enumerate(cells):
        column = {"query_range": list(query_range), "max_offset": max_offset}
        for m, name in enumerate(metrics):
            per_head = sums[c, m] / len(tokens)
            column[name] = {"best": float(per_head.min()), "head": int(per_head.argmin()),
                            "per_head": per_head.tolist()}
        columns.append(column)
    return {"length": plan["length"], "tokens": list(tokens), "columns": columns}


# ---------------------------------------------------------------------------- R ablation (Figure 14)

def r_grids(records: list[dict]) -> list[dict]:
    """Groups R-ablation results into one grid per SPE family (Figure 14's layout).

    Args:
        records: one per (checkpoint, test R): ``family`` (e.g. "sinespe/performer"),
            ``trained`` (R at training), ``test`` (R at test), ``within`` and ``beyond``
            (mean cross-entropy, nats/token). Checkpoints of one family with the same trained
            R (e.g. seeds) are averaged.

    Returns:
        One dict per family, in order of appearance: ``label``, ``trained`` (sorted R),
        ``test`` (sorted R), ``within`` and ``beyond`` as (len(trained), len(test)) nested
        lists, NaN where nothing was measured; ``count`` gives the checkpoints averaged per cell.

    Raises:
        ValueError: if a record lacks a key.
    """
    needed = ("family", "trained", "test", "within", "beyond")
    families: dict[str, list[dict]] = {}
    for rec in records:
        missing = [k for k in needed if k not in rec]
        if missing:
            raise ValueError(f"R-ablation record {rec!r} lacks {', '.join(missing)}")
        families.setdefault(rec["family"], []).append(rec)
    grids = []
    for family, recs in families.items():
        trained = sorted({int(r["trained"]) for r in recs})
        test = sorted({int(r["test"]) for r in recs})
        grid = {"label": family, "trained": trained, "test": test}
        count = np.zeros((len(trained), len(test)))
        for key in ("within", "beyond"):
            total = np.zeros((len(trained), len(test)))
            count[:] = 0
            for r in recs:
                i, j = trained.index(int(r["trained"])), test.index(int(r["test"]))
                total[i, j] += r[key]
                count[i, j] += 1
            with np.errstate(invalid="ignore", divide="ignore"):
                grid[key] = np.where(count > 0, total / np.maximum(count, 1), np.nan).tolist()
        grid["count"] = count.astype(int).tolist()
        grids.append(grid)
    return grids


# ---------------------------------------------------------------------------- helpers

def _fmt(value, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _mean_std(mean, std) -> str:
    return _fmt(mean) + ("" if std is None or not math.isfinite(std) else f" ± {std:.3f}")


def _names(checkpoints: list[str]) -> list[str]:
    """Short unique file-name-safe names from the run folders' paths.

    The run folder's name, or, when those repeat (``ape/seed0``, ``sinespe/seed0``), as many
    trailing folder names as make them unique, leaving out a final part they all share.
    """
    parts = []
    for ckpt in checkpoints:
        p = Path(ckpt)
        run = p if p.is_dir() else (p.parent if p.stem == "model" else p.with_suffix(""))
        parts.append([re.sub(r"[^A-Za-z0-9._-]+", "-", q).strip("-.") or "model" for q in run.parts])
    shared_last = len(parts) > 1 and len({tuple(p[-1:]) for p in parts}) == 1
    trimmed = [p[:-1] or p for p in parts] if shared_last else parts
    for depth in range(1, max(len(p) for p in trimmed) + 1):
        names = ["-".join(p[-depth:]) for p in trimmed]
        if len(set(names)) == len(names):
            return names
    names, seen = [], set()
    for base in (p[-1] for p in parts):
        name, k = base, 2
        while name in seen:
            name, k = f"{base}-{k}", k + 1
        seen.add(name)
        names.append(name)
    return names


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def _soundfont() -> tuple[Path | None, str]:
    env = os.environ.get("SPE_SOUNDFONT")
    if env:
        return (Path(env), "") if Path(env).is_file() else (None, f"SPE_SOUNDFONT={env} is not a file")
    for candidate in SOUNDFONTS:
        if Path(candidate).is_file():
            return Path(candidate), ""
    return None, f"no General MIDI soundfont at {' or '.join(SOUNDFONTS)} and SPE_SOUNDFONT is not set"


def _render_audio(midis: list[Path]) -> tuple[list[Path | None], str]:
    """WAV files beside the MIDI files, or Nones and the reason audio was skipped."""
    from spe.checkpoint import atomic_write

    fluidsynth = shutil.which("fluidsynth")
    if fluidsynth is None:
        return [None] * len(midis), "skipped: `fluidsynth` is not on PATH"
    soundfont, why = _soundfont()
    if soundfont is None:
        return [None] * len(midis), f"skipped: {why}"
    wavs, failures = [], []
    for midi in midis:
        wav = midi.with_suffix(".wav")

        def render(tmp: str, midi: Path = midi) -> None:
            # -T wav: the temporary name has no .wav suffix to infer the file type from.
            done = subprocess.run([fluidsynth, "-ni", "-T", "wav", "-F", tmp, "-r", "44100", str(soundfont),
                                   str(midi)], check=False, capture_output=True, text=True,
                                  timeout=600)
            if done.returncode != 0:
                raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else
                                   f"exit status {done.returncode}")

        try:
            atomic_write(wav, render)
            wavs.append(wav)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
            failures.append(f"{midi.name}: {err}")
            wavs.append(None)
    note = f"rendered to WAV with FluidSynth and {soundfont}"
    if failures:
        note += "; failed for " + "; ".join(failures)
    return wavs, note


def _corpus_validation(meta: dict, data: str | None, cache_dir: str | None):
    """The tokenizer that produced the corpus ids, and the validation pieces (token arrays) of the split."""
    from spe.data.music import load_corpus, make_tokenizer

    train_cfg = meta.get("train", {})
    corpus = load_corpus(data if data is not None else train_cfg.get("data"),
                         cache_dir=cache_dir or train_cfg.get("cache_dir"), progress=False)
    _, val_idx = corpus.split(train_cfg.get("val_fraction", 0.05), train_cfg.get("split_seed", 0))
    # load_corpus encodes with make_tokenizer(): decode the corpus ids with the same one.
    return make_tokenizer(), [corpus.pieces[i] for i in val_idx]


def _write_prompt(val_pieces, tokenizer, path: Path) -> tuple[int, dict]:
    """Writes the first PROMPT_BARS bars of a validation piece as MIDI; returns (bars, facts)."""
    from spe.checkpoint import atomic_write

    bar = tokenizer.vocab["Bar_None"]
    bars_of = [[i for i, t in enumerate(p) if t == bar] for p in val_pieces]
    # A piece that goes on after the prompt, so the prompt is exactly PROMPT_BARS bars.
    pick = next((i for i, b in enumerate(bars_of) if len(b) > PROMPT_BARS),
                max(range(len(val_pieces)), key=lambda i: len(val_pieces[i])))
    ids = [int(t) for t in val_pieces[pick]]
    if len(bars_of[pick]) > PROMPT_BARS:
        ids = ids[:bars_of[pick][PROMPT_BARS]]
    score = tokenizer.decode(ids)
    atomic_write(path, lambda tmp: score.dump_midi(tmp))
    bars = min(len(bars_of[pick]), PROMPT_BARS)
    return bars, {"validation_piece": pick, "tokens": len(ids), "bars": bars,
                  "notes": sum(len(t.notes) for t in score.tracks)}


def _bar_start(score, bar: int) -> int:
    """Tick where bar ``bar`` (0-based) starts, following the score's time signatures (4/4 if none).

    REMI changes time signature only at bar lines, so bars are walked one at a time with the
    signature in force at each bar's start.
    """
    signatures = sorted((int(ts.time), int(ts.numerator), int(ts.denominator)) for ts in score.time_signatures)
    tick = 0
    for _ in range(bar):
        _, num, den = next((s for s in reversed(signatures) if s[0] <= tick), (0, 4, 4))
        tick += score.tpq * 4 * num // den  # a bar of num notes of 1/den whole note
    return tick


def _style_rows(prompt: Path, generated: Path, prompt_end_tick: int) -> dict:
    """Cosine similarity of both style profiles between the prompt and each continuation part."""
    from symusic import Score

    from spe.metrics import onset_duration_profile, split_equal_parts, style_similarity, time_pitch_profile

    ref = Score(str(prompt))
    ref_od, ref_tp = onset_duration_profile(ref), time_pitch_profile(ref)
    score = Score(str(generated))
    parts = split_equal_parts(score, NUM_PARTS, start=prompt_end_tick, end=max(score.end(), prompt_end_tick))
    return {"onset_duration": [style_similarity(ref_od, onset_duration_profile(p)) for p in parts],
            "time_pitch": [style_similarity(ref_tp, time_pitch_profile(p)) for p in parts],
            "notes_per_part": [sum(len(t.notes) for t in p.tracks) for p in parts],
            "beats": (max(score.end(), prompt_end_tick) - prompt_end_tick) / score.tpq}


# ---------------------------------------------------------------------------- the report

def build_report(checkpoints: list[str], out: str | os.PathLike, *, data: str | None = None,
                 cache_dir: str | None = None, max_length: int | None = None, r_test=(),
                 generate_length: int = 1024, num_probe_tokens: int = 16, device: str = "cpu",
                 progress: bool = True, batch_size: int = 8, seed: int = 0) -> Path:
    """Evaluates checkpoints and writes ``OUT/report.md`` with tables, pictures, MIDI (and audio).

    Args:
        checkpoints: run folders or ``.safetensors`` files trained by ``spe train`` on music,
            with the same tokenizer; the first one's data split is used for all.
        out: output folder (created).
        data: MIDI folder or ``music21:NAME`` (default: the first checkpoint's training data).
        cache_dir: corpus cache (default: the first checkpoint's).
        max_length: evaluated positions (default 2 × the longest training length).
        r_test: test-time R values for the R ablation of SPE checkpoints (empty: skipped).
        generate_length: tokens generated after the prompt, per model.
        num_probe_tokens: vocabulary tokens used for identical-token probing (evenly spaced).
        device: ``cpu`` or ``cuda``.
        progress: show tqdm progress bars.
        batch_size: sequences per forward pass in evaluation.
        seed: sampling seed of the generations (the same for every model).

    Returns:
        The path of ``report.md``.

    Raises:
        ValueError: (UsageError) on no checkpoint, non-positive lengths or counts, checkpoints
            without a music tokenizer or with different tokenizers, or data too short.
        FileNotFoundError: if a checkpoint does not exist.
    """
    import torch
    from symusic import Score

    from spe import __version__
    from spe.checkpoint import atomic_write, load, load_metadata
    from spe.data.music import same_tokenizer
    from spe.evaluation.pictures import (
        plot_attention,
        plot_kernels,
        plot_piano_roll,
        plot_r_grid,
        plot_style_similarity,
    )

    checkpoints = [str(c) for c in checkpoints]
    if not checkpoints:
        raise UsageError("give at least one --checkpoint")
    for name, value in (("--length", generate_length), ("--probe-tokens", num_probe_tokens),
                        ("--max-length", 1 if max_length is None else max_length)):
        if value < 1:
            raise UsageError(f"{name} must be positive, got {value}")
    r_test = [int(r) for r in r_test]
    if any(r < 1 for r in r_test):
        raise UsageError(f"--r-test takes positive integers, got {r_test}")
    out = Path(out)
    figures, generated = out / "figures", out / "generated"
    metas = [load_metadata(c) for c in checkpoints]
    for ckpt, meta in zip(checkpoints, metas):
        if "tokenizer" not in meta:
            raise UsageError(f"{ckpt} holds no tokenizer: it was not trained on music by `spe train`")
        if not same_tokenizer(meta["tokenizer"], metas[0]["tokenizer"]):
            raise UsageError(f"{ckpt} was trained with another REMI tokenizer than {checkpoints[0]}: "
                             "token ids would not match")
    names = _names(checkpoints)
    seq_lens = [int(m.get("train", {}).get("seq_len", 256)) for m in metas]
    length = max_length or 2 * max(seq_lens)
    report: dict = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "spe_version": __version__,
                    "max_length": length, "device": device,
                    "data": data or metas[0].get("train", {}).get("data") or "Bach chorales (music21)",
                    "models": [{"name": n, "checkpoint": c, "step": m.get("step"), "seq_len": s,
                                "config": m["config"]} for n, c, m, s in zip(names, checkpoints, metas, seq_lens)]}

    # 1. Extrapolation: all checkpoints on the same validation sequences.
    summary = evaluate_checkpoints(checkpoints, out / "extrapolation", max_length=length, data=data,
                                   cache_dir=cache_dir, batch_size=batch_size, device=device, json_path=None,
                                   progress=progress)
    report["extrapolation"] = {k: v for k, v in summary.items() if k != "models"}
    report["extrapolation"]["models"] = [{k: v for k, v in m.items() if k != "per_position"}
                                         for m in summary["models"]]
    tokenizer, val_pieces = _corpus_validation(metas[0], data, cache_dir)

    # 2-4. Per model: PE metrics, kernels, attention maps.
    attn_len = min(length, MAX_ATTENTION_LENGTH)
    attn_piece = next((p for p in val_pieces if len(p) >= attn_len), max(val_pieces, key=len))
    attn_tokens = torch.as_tensor(np.asarray(attn_piece[:attn_len], dtype=np.int64))
    pe, kernels, attention = {}, {}, {}
    for name, ckpt, seq_len in zip(names, checkpoints, seq_lens):
        model = load(ckpt, device=device)
        positional = model.config.positional
        if positional in SCORE_POSITIONALS:
            pe[name] = {"skipped": f"{positional} adds a term to the attention scores: the identical-token probe "
                                   "reads exp(q·k/√E) only"}
        else:
            try:
                pe[name] = pe_metrics(model, seq_len=seq_len, progress=progress,
                                      tokens=probe_tokens(model.config.vocab_size, num_probe_tokens))
            except ValueError as err:
                pe[name] = {"skipped": str(err)}
        if positional in SPE_POSITIONALS:
            kernels[name] = f"figures/kernels-{name}.png"
            plot_kernels(model, out / kernels[name], max_lag=seq_len, layer=0)
        try:
            attention[name] = f"figures/attention-{name}.png"
            plot_attention(model, attn_tokens, out / attention[name], layers=(0, -1), training_length=seq_len)
        except ValueError as err:
            attention[name] = f"skipped: {err}"
    report["pe_metrics"], report["kernels"], report["attention"] = pe, kernels, attention

    # 5. Generation from the same prompt, and style similarity of each continuation part to it.
    prompt_path = generated / "prompt.mid"
    prompt_bars, prompt_info = _write_prompt(val_pieces, tokenizer, prompt_path)
    style, gen_info, midis = [], {}, []
    for name, ckpt in zip(names, checkpoints):
        midi = generated / f"{name}.mid"
        info = generate_midi(ckpt, str(midi), length=generate_length, prompt=str(prompt_path),
                             prompt_bars=PROMPT_BARS, seed=seed, top_p=0.9, temperature=1.2, device=device,
                             progress=progress)
        score = Score(str(midi))
        prompt_end = _bar_start(score, prompt_bars)  # the continuation starts at the prompt's last bar line
        row = {"label": name, **_style_rows(prompt_path, midi, prompt_end)}
        style.append(row)
        roll = f"figures/piano-roll-{name}.png"
        plot_piano_roll(score, out / roll, prompt_end=prompt_end / score.tpq,
                        title=f"{name}: {info['generated_tokens']} tokens after a {prompt_bars}-bar prompt")
        gen_info[name] = {**{k: v for k, v in info.items() if k != "out"}, "midi": f"generated/{name}.mid",
                          "piano_roll": roll}
        midis.append(midi)
    plot_style_similarity(style, figures / "style-similarity.png")
    wavs, audio_note = _render_audio(midis)
    for name, wav in zip(names, wavs):
        gen_info[name]["audio"] = None if wav is None else f"generated/{wav.name}"
    report["generation"] = {"prompt": {**prompt_info, "midi": "generated/prompt.mid"}, "models": gen_info,
                            "style": style, "audio": audio_note, "seed": seed, "length": generate_length}

    # 6. R ablation over SPE checkpoints.
    grids, r_note = [], ""
    if r_test:
        spe_idx = [i for i, m in enumerate(metas) if m["config"]["positional"] in SPE_POSITIONALS]
        if not spe_idx:
            r_note = "R ablation skipped: no sinespe or convspe checkpoint among those given"
        else:
            records = []
            for r in r_test:
                res = evaluate_checkpoints([checkpoints[i] for i in spe_idx], out / "r-grid" / f"R{r}",
                                           max_length=length, data=data, cache_dir=cache_dir,
                                           batch_size=batch_size, device=device, json_path=None,
                                           progress=progress, num_realizations=r)
                for i, m in zip(spe_idx, res["models"]):
                    records.append({"family": m["label"], "trained": metas[i]["config"]["num_realizations"],
                                    "test": r, "within": m["within"], "beyond": m["beyond"]})
            grids = r_grids(records)
            for k, grid in enumerate(grids):
                grid["figure"] = f"figures/r-grid-{k + 1}.png"
                plot_r_grid(grid, out / grid["figure"])
    report["r_grid"] = {"test": r_test, "grids": grids, "note": r_note}

    text = "\n".join(_markdown(report, names, summary)) + "\n"
    atomic_write(out / "report.json", lambda tmp: Path(tmp).write_text(json.dumps(report, indent=2, default=str)))
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text(text))
    return out / "report.md"


def _markdown(report: dict, names: list[str], summary: dict) -> list[str]:
    models = report["models"]
    lines = ["# SPE report", "",
             f"Written {report['date']} by `spe report` (spe {report['spe_version']}) on {report['device']}.", "",
             "## What was run", ""]
    lines += _table(["model", "checkpoint", "positional", "attention", "gated", "R", "training length", "step"],
                    [[m["name"], f"`{m['checkpoint']}`", m["config"]["positional"], m["config"]["attention"],
                      "yes" if m["config"].get("gated", True) else "no",
                      str(m["config"]["num_realizations"]) if m["config"]["positional"] in SPE_POSITIONALS else "–",
                      str(m["seq_len"]), str(m["step"])] for m in models])
    lines += ["", (f"Data: `{report['data']}`, validation split of the first checkpoint "
              f"({summary['num_validation_pieces']} pieces; {summary['num_sequences']} of them have the "
              f"{summary['max_length'] + 1} tokens that evaluation needs). "
              f"Evaluated positions: {summary['max_length']} (2 × training length unless `--max-length`)."), ""]

    # 1. Extrapolation
    lines += ["## 1. Extrapolation beyond the training length (Table 6, Figure 3)", "",
              ("Teacher-forced cross-entropy of the next token, in nats/token (lower is better), averaged over "
              "positions within the training length (0 ≤ t < L) and beyond it (L ≤ t < "
              f"{summary['max_length']}). ± is the standard deviation over validation sequences of each "
              "sequence's mean over those positions (n/a with a single sequence). A model that extrapolates "
              "keeps `beyond` close to `within`; the unigram row is the training token frequencies."), ""]
    rows = []
    for name, m in zip(names, summary["models"]):
        rows.append([name, m["label"], str(m["seq_len"]), _mean_std(m["within"], m.get("within_std")),
                     _mean_std(m["beyond"], m.get("beyond_std"))])
    rows.append(["unigram", "–", "–", _fmt(summary["unigram"]), ""])
    lines += _table(["model", "encoding/attention", "L", "within (nats/token)", "beyond (nats/token)"], rows)
    lines += ["", "![Cross-entropy by position](extrapolation/extrapolation.png)", "",
              "Per-position values: `extrapolation/per_position.csv`; buckets: `extrapolation/summary.json`.", ""]

    # 2. PE metrics
    lines += ["## 2. Positional-encoding properties (Table 7)", "",
              ("Identical-token probing (Wang et al. 2021; appendix D.3): the first layer's unnormalised attention "
              "exp(q·k/√E) on a sequence repeating one token, for tokens evenly spaced over the vocabulary. "
              "**T** (translation invariance) is the share of the attention's variance not explained by the "
              "query-key offset; **M** (monotonicity) is the fraction of key pairs whose attention grows with the "
              "offset. Both lie in [0, 1], lower is better; each cell is the best head (head number in "
              "parentheses, from 1) of the per-head mean over the probe tokens. Columns: query positions "
              "[start, stop) and offsets m − n < N; queries at or beyond L are extrapolation. The ranges scale "
              "Table 7's (trained on 2048 tokens, queries up to 2560, offsets < 128/512/1024) to each training "
              "length L: probe length L + min(L, 512), queries [0, L) and [L, L + min(L, 512)), offsets "
              "< min(64, L) and < min(L, 512). The paper finds "
              "monotonicity of little relevance for music, and a position-blind head scores T = M = 0: read "
              "both together with the extrapolation table."), ""]
    for metric, title in (("T", "Translation invariance T (lower is better)"),
                          ("M", "Monotonicity M (lower is better)")):
        lines += [f"**{title}**", ""]
        rows, notes = [], []
        columns = None
        for name in names:
            res = report["pe_metrics"][name]
            if "skipped" in res:
                notes.append(f"- {name}: skipped ({res['skipped']})")
                continue
            cells = res["columns"]
            if columns is None:
                columns = [(tuple(c["query_range"]), c["max_offset"]) for c in cells]
            # Models with other training lengths have other ranges: name them in the cells.
            same = [(tuple(c["query_range"]), c["max_offset"]) for c in cells] == columns
            rows.append([name, str(len(res["tokens"])), str(res["length"])] + [
                (f"{c[metric]['best']:.4f} (h{c[metric]['head'] + 1})" if same else
                 f"{c[metric]['best']:.4f} (h{c[metric]['head'] + 1}; q {c['query_range']}, "
                 f"o < {c['max_offset'] + 1})") for c in cells])
        if rows:
            width = max(len(r) for r in rows)
            header = ["model", "tokens", "probe length"] + [f"q ∈ [{a}, {b}), o < {o + 1}"
                                                             for (a, b), o in columns]
            header += [""] * (width - len(header))
            lines += _table(header, [r + [""] * (width - len(r)) for r in rows])
        lines += ["", *notes, ""] if notes else [""]

    # 3. Kernels
    lines += ["## 3. Learned positional kernels (Figure 7)", "",
              ("The effective kernel (1 − δ_d)·P_d(τ) + δ_d of the first layer for every head and feature d: "
              "P_d from the encoding's exact expected kernel, δ_d the layer's gate (0 when ungated). Red is "
              "positive, blue negative; a row that is flat at 1 is a feature the gate has switched off "
              "(position-blind). sineSPE is periodic in τ, convSPE vanishes beyond its filter length."), ""]
    if report["kernels"]:
        for name, png in report["kernels"].items():
            lines += [f"![{name} kernels]({png})", ""]
    else:
        lines += ["No SPE model among the checkpoints: nothing to show.", ""]

    # 4. Attention
    lines += ["## 4. Attention maps (Figures 8-12)", "",
              ("Softmax attention of the first and the last layer on one validation sequence, computed offline "
              "from the queries and keys the kernel sees (q̂·k̂/√R with SPE, q·k/√D otherwise; a Performer "
              "approximates this matrix). Colour min{1, (a/0.02)^0.4} as in the paper; dashed lines: the "
              "training length. Attention piling up at the training length (APE) signals failed extrapolation."),
              ""]
    for name, png in report["attention"].items():
        lines += [f"- {name}: {png}" if png.startswith("skipped") else f"![{name} attention]({png})", ""]

    # 5. Generation
    gen = report["generation"]
    p = gen["prompt"]
    lines += ["## 5. Generation and style similarity (Figure 5)", "",
              (f"Prompt: the first {p['bars']} bars of validation piece #{p['validation_piece']} "
              f"({p['tokens']} tokens, {p['notes']} notes; [{p['midi']}]({p['midi']})). Each model continues it "
              f"with {gen['length']} tokens (nucleus sampling, top-p 0.9, temperature 1.2, seed {gen['seed']}). "
              f"The continuation after the prompt is cut into {NUM_PARTS} parts of equal duration, and each part's "
              "style profiles (onset-duration and time-pitch histograms, appendix C.2) are compared with the "
              "prompt's by cosine similarity: higher means closer to the prompt's style, and a drop in later "
              "parts means the model drifts as the piece grows past the training length."), ""]
    rows = []
    for s in gen["style"]:
        info = gen["models"][s["label"]]
        rows.append([s["label"], str(info["notes"]), f"{s['beats']:.1f}",
                     " / ".join(_fmt(v) for v in s["onset_duration"]),
                     " / ".join(_fmt(v) for v in s["time_pitch"])])
    lines += _table(["model", "notes", "continuation (beats)", f"onset-duration, parts 1–{NUM_PARTS}",
                     f"time-pitch, parts 1–{NUM_PARTS}"], rows)
    lines += ["", "![Style similarity](figures/style-similarity.png)", ""]
    for name, info in gen["models"].items():
        audio = f", audio: [{info['audio']}]({info['audio']})" if info["audio"] else ""
        lines += [(f"**{name}**: [{info['midi']}]({info['midi']}){audio}, {info['total_tokens']} tokens, "
                  f"{info['bars']} bars, {info['beats']:.1f} beats (dashed line: end of the prompt)"), "",
                  f"![{name} piano roll]({info['piano_roll']})", ""]
    lines += [f"Audio: {gen['audio']}.", ""]

    # 6. R ablation
    r = report["r_grid"]
    lines += ["## 6. Number of realisations R (Figure 14)", ""]
    if not r["test"]:
        lines += ["Not run (give `--r-test`, e.g. `--r-test 8,32,64`).", ""]
    elif r["note"]:
        lines += [r["note"] + ".", ""]
    else:
        lines += [("Cross-entropy (nats/token, lower is better) of each SPE model evaluated with R_test "
                  "realisations, rows grouped by the R it was trained with (checkpoints sharing both are "
                  "averaged). Bold in the figures: R_test = R_train."), ""]
        for grid in r["grids"]:
            lines += [f"**{grid['label']}**", ""]
            header = ["R_train \\ R_test"] + [str(t) for t in grid["test"]]
            for key in ("within", "beyond"):
                lines += [f"{key} the training length:", ""]
                lines += _table(header, [[str(rt)] + [_fmt(v) for v in row]
                                         for rt, row in zip(grid["trained"], grid[key])])
                lines += [""]
            lines += [f"![R grid {grid['label']}]({grid['figure']})", ""]
    return lines


def publish_report(report_dir: str | os.PathLike, doc: str | os.PathLike, *, preamble: str = "") -> Path:
    """Copies a report into the documentation: ``doc`` (Markdown) and its PNGs beside it.

    Images go to ``DOC_STEM/`` next to ``doc`` with links rewritten; links to generated MIDI
    and audio become plain text (generated music is not committed); absolute checkpoint
    paths are shown relative to the working directory when they lie below it.

    Args:
        report_dir: folder written by :func:`build_report` (holds ``report.md``).
        doc: destination Markdown file, e.g. ``docs/results.md``.
        preamble: Markdown put before the report (how it was produced).

    Returns:
        The path of ``doc``.

    Raises:
        ValueError: if ``report_dir`` holds no ``report.md``.
    """
    from spe.checkpoint import atomic_write

    src, doc = Path(report_dir), Path(doc)
    if not (src / "report.md").is_file():
        raise ValueError(f"{src} holds no report.md: run `spe report --out {src}` first")
    images = doc.parent / doc.stem
    images.mkdir(parents=True, exist_ok=True)
    text = (src / "report.md").read_text()

    def image(match: re.Match) -> str:
        alt, target = match.group(1), match.group(2)
        name = target.replace("/", "-")
        shutil.copyfile(src / target, images / name)
        return f"![{alt}]({images.name}/{name})"

    text = re.sub(r"!\[([^\]]*)\]\(([^)]+\.png)\)", image, text)
    text = re.sub(r"\[([^\]]+)\]\(([^)]+\.(?:mid|wav))\)", r"`\1` (in the report folder, not committed)", text)
    cwd = str(Path.cwd()) + os.sep
    text = text.replace(cwd, "")
    atomic_write(doc, lambda tmp: Path(tmp).write_text(preamble + text))
    return doc
