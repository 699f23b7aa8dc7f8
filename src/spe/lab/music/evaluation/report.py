"""``spe report``: one Markdown report with the paper's tables and pictures for a set of checkpoints.

Sections (Liutkus et al. 2021): extrapolation (Table 6, Figure 3), positional-encoding
properties (Table 7), learned kernels (Figure 7), attention maps (Figures 8-12), generation
and style similarity (Figure 5), and the R ablation (Figure 14) when test-time R values are
given. Everything lands in one folder: ``report.md``, ``report.json`` (every number), PNGs,
the generated MIDI files and, when FluidSynth and a soundfont are found, WAV renderings.

Each section is a compute function here (numbers, figures and files; its part of
``report.json``) and a render function in :mod:`spe.lab.music.evaluation.report_markdown`. Every
checkpoint is loaded once and the corpus is split once; all sections share them.
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path

import numpy as np
import torch

from spe.lab import strict_json
from spe.checkpoint import LoadedCheckpoint, atomic_write, load
from spe.lab.music.split import CorpusSplit, split_of_run
from spe.encodings.registry import positional_names, positional_spec
from spe.lab.music.evaluation.checkpoints import check_tokenizers, evaluate_models, stored_summary, write_evaluation
from spe.lab.music.evaluation.r_grid import r_grids
from spe.lab.music.evaluation.report_markdown import render_report
from spe.lab.outputs import check_output_folder

__all__ = ["MAX_ATTENTION_LENGTH", "build_report", "generation_section", "model_sections", "r_grid_section",
           "run_names"]

# Attention maps are L × L images per head: beyond this many tokens they cost memory, not insight.
MAX_ATTENTION_LENGTH = 1024


def run_names(checkpoints: list[str]) -> list[str]:
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


def _check_options(checkpoints: list, generate_length: int, num_probe_tokens: int, max_length: int | None,
                   r_test: list[int]) -> None:
    if not checkpoints:
        raise ValueError("give at least one --checkpoint")
    for name, value in (("--length", generate_length), ("--probe-tokens", num_probe_tokens),
                        ("--eval-length", 1 if max_length is None else max_length)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if any(r < 1 for r in r_test):
        raise ValueError(f"--r-test takes positive integers, got {r_test}")


def model_sections(loaded: list[LoadedCheckpoint], names: list[str], split: CorpusSplit, out: Path, *,
                   length: int, num_probe_tokens: int, progress: bool) -> dict:
    """Sections 2-4 per model: PE metrics (Table 7), kernels (Figure 7, SPE only), attention maps.

    Returns:
        ``{"pe_metrics": {name: result or {"skipped": why}}, "kernels": {name: png},
        "attention": {name: png or "skipped: why"}}``, paths relative to ``out``.
    """
    from spe.lab.music.evaluation.pictures import plot_attention, plot_kernels
    from spe.lab.metrics.pe_probe import pe_metrics, probe_tokens

    attn_len = min(length, MAX_ATTENTION_LENGTH)
    attn_piece = next((p for p in split.val_pieces if len(p) >= attn_len), max(split.val_pieces, key=len))
    attn_tokens = torch.as_tensor(np.asarray(attn_piece[:attn_len], dtype=np.int64))
    pe, kernels, attention = {}, {}, {}
    for name, c in zip(names, loaded):
        positional = c.config.positional
        if positional in positional_names(acts_on="scores"):
            pe[name] = {"skipped": f"{positional} adds a term to the attention scores: the identical-token probe "
                                   "reads exp(q·k/√E) only"}
        else:
            try:
                pe[name] = pe_metrics(c.model, seq_len=c.seq_len, progress=progress,
                                      tokens=probe_tokens(c.config.vocab_size, num_probe_tokens))
            except ValueError as err:
                pe[name] = {"skipped": str(err)}
        if positional_spec(positional).stochastic:
            kernels[name] = f"figures/kernels-{name}.png"
            plot_kernels(c.model, out / kernels[name], max_lag=c.seq_len, layer=0)
        try:
            attention[name] = f"figures/attention-{name}.png"
            plot_attention(c.model, attn_tokens, out / attention[name], layers=(0, -1), training_length=c.seq_len)
        except ValueError as err:
            attention[name] = f"skipped: {err}"
    return {"pe_metrics": pe, "kernels": kernels, "attention": attention}


def generation_section(loaded: list[LoadedCheckpoint], names: list[str], split: CorpusSplit, out: Path, *,
                       length: int, seed: int, progress: bool) -> dict:
    """Section 5: every model continues the same validation prompt; style similarity per part.

    Writes ``generated/prompt.mid``, ``generated/NAME.mid`` (and ``.wav`` when FluidSynth
    renders them), piano rolls and ``figures/style-similarity.png``.
    """
    from symusic import Score

    from spe.lab.music.corpus import tokenizer_from_json
    from spe.lab.music.evaluation.audio import render_audio
    from spe.lab.music.evaluation.music_prompt import PROMPT_BARS, bar_start, style_rows, write_prompt
    from spe.lab.music.evaluation.pictures import plot_piano_roll, plot_style_similarity
    from spe.lab.music.generation import generate_midi

    generated = out / "generated"
    prompt_path = generated / "prompt.mid"
    # the corpus was tokenised with the run's tokenizer: decode its ids with the same one
    prompt_bars, prompt_info = write_prompt(split.val_pieces, tokenizer_from_json(split.tokenizer_json), prompt_path)
    style, gen_info, midis = [], {}, []
    for name, c in zip(names, loaded):
        midi = generated / f"{name}.mid"
        info = generate_midi(c, str(midi), length=length, prompt=str(prompt_path), prompt_bars=PROMPT_BARS,
                             seed=seed, top_p=0.9, temperature=1.2, progress=progress)
        score = Score(str(midi))
        prompt_end = bar_start(score, prompt_bars)  # the continuation starts at the prompt's last bar line
        style.append({"label": name, **style_rows(prompt_path, midi, prompt_end)})
        roll = f"figures/piano-roll-{name}.png"
        plot_piano_roll(score, out / roll, prompt_end=prompt_end / score.tpq,
                        title=f"{name}: {info['generated_tokens']} tokens after a {prompt_bars}-bar prompt")
        gen_info[name] = {**{k: v for k, v in info.items() if k != "out"}, "midi": f"generated/{name}.mid",
                          "piano_roll": roll}
        midis.append(midi)
    plot_style_similarity(style, out / "figures" / "style-similarity.png")
    wavs, audio_note = render_audio(midis)
    for name, wav in zip(names, wavs):
        gen_info[name]["audio"] = None if wav is None else f"generated/{wav.name}"
    return {"prompt": {**prompt_info, "midi": "generated/prompt.mid"}, "models": gen_info,
            "style": style, "audio": audio_note, "seed": seed, "length": length}


def r_grid_section(loaded: list[LoadedCheckpoint], split: CorpusSplit, out: Path, *, length: int,
                   r_test: list[int], batch_size: int, progress: bool) -> dict:
    """Section 6: every SPE model evaluated at each test-time R (``r-grid/R{r}/``), grouped by trained R.

    Returns:
        ``{"test": r_test, "grids": [...] (see :func:`~spe.lab.music.evaluation.r_grid.r_grids`, with
        ``figure``), "note": why it was skipped, or ""}``.
    """
    from spe.lab.music.evaluation.pictures import plot_r_grid

    grids, note = [], ""
    spe_models = [c for c in loaded if positional_spec(c.config.positional).stochastic]
    if r_test and not spe_models:
        note = "R ablation skipped: no sinespe or convspe checkpoint among those given"
    elif r_test:
        records = []
        for r in r_test:
            res = evaluate_models(spe_models, split, max_length=length, batch_size=batch_size, num_realizations=r,
                                  progress=progress)
            write_evaluation(res, out / "r-grid" / f"R{r}")
            for c, m in zip(spe_models, res["models"]):
                records.append({"family": m["label"], "trained": c.metadata["config"]["num_realizations"],
                                "test": r, "within": m["within"], "beyond": m["beyond"]})
        grids = r_grids(records)
        for k, grid in enumerate(grids):
            grid["figure"] = f"figures/r-grid-{k + 1}.png"
            plot_r_grid(grid, out / grid["figure"])
    return {"test": r_test, "grids": grids, "note": note}


def _header(loaded: list[LoadedCheckpoint], names: list[str], *, length: int, data: str | None,
            device: str) -> dict:
    from spe import __version__

    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "spe_version": __version__,
            "max_length": length, "device": device,
            "data": data or loaded[0].train_config.get("data") or "Bach chorales (music21)",
            "models": [{"name": n, "checkpoint": c.path, "step": c.step, "seq_len": c.seq_len,
                        "config": c.metadata["config"]} for n, c in zip(names, loaded)]}


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
        ValueError: on no checkpoint, non-positive lengths or counts, checkpoints without a
            music tokenizer or with different tokenizers, or data too short.
        FileNotFoundError: if a checkpoint does not exist.
    """
    checkpoints = [str(c) for c in checkpoints]
    r_test = [int(r) for r in r_test]
    _check_options(checkpoints, generate_length, num_probe_tokens, max_length, r_test)
    out = check_output_folder(out)
    loaded = [load(c, device=device) for c in checkpoints]
    check_tokenizers(loaded)
    names = run_names(checkpoints)
    length = max_length or 2 * max(c.seq_len for c in loaded)
    split = split_of_run(loaded[0].train_config, data=data, cache_dir=cache_dir,
                         tokenizer_json=loaded[0].tokenizer_json)
    report = _header(loaded, names, length=length, data=data, device=device)
    summary = evaluate_models(loaded, split, max_length=length, batch_size=batch_size, progress=progress)
    write_evaluation(summary, out / "extrapolation")
    report["extrapolation"] = stored_summary(summary)
    report.update(model_sections(loaded, names, split, out, length=length, num_probe_tokens=num_probe_tokens,
                                 progress=progress))
    report["generation"] = generation_section(loaded, names, split, out, length=generate_length, seed=seed,
                                              progress=progress)
    report["r_grid"] = r_grid_section(loaded, split, out, length=length, r_test=r_test, batch_size=batch_size,
                                      progress=progress)
    text = "\n".join(render_report(report)) + "\n"
    atomic_write(out / "report.json",
                 lambda tmp: Path(tmp).write_text(strict_json.dumps(report, indent=2, default=str)))
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text(text))
    return out / "report.md"
