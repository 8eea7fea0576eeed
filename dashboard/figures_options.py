"""Selective recomputation in the Planner view: options on the schedule figure, selective and torch.compile
on the Pareto figure.

Builders on top of :mod:`dashboard.figures_planner` (plotly's JSON form, as there):

* :func:`schedule_figure_with_options`: an ``F_all`` that keeps less than everything (``F_all(3)[2]``) is
  drawn in its option's colour, labelled with the option's name, and its hover says what it keeps and what
  ``B`` recomputes; plain operations are drawn as before.
* :func:`pareto_with_options`: the Pareto figure with the slider's front named after its DP (``selective``
  or ``rotor``) and torch.compile's measured points (:class:`planner.measure.compile_baseline.CompilePoint`) as
  distinct markers, labelled with their ``activation_memory_budget``.

What the axes mean for torch.compile's points: the planner's points are *predicted* whole-step peaks (the
chain's simulated peak plus what the step holds beside it) against the chain's predicted forward+backward
makespan. A compile point is *measured*: ``step_peak_bytes``, the whole step's peak (what it started with --
weights, gradients, optimizer state, batch -- plus the allocator's highest rise during it), the same quantity
on the memory axis; its time is the measured median of the whole training step (the optimizer step and the
modules outside the chain included, eager kernels), so it sits above the planner's makespans by what lies
outside the chain: compare the points' spread more than their height. A chain-only figure (no step costs)
counts activations, which a compile point does not measure: the points are then left out and the figure
says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboard.figures import byte_axis, plot_text
from dashboard.figures_pareto import pareto_base
from dashboard.figures_planner import ALGORITHM_COLORS, Figure, memory_labels, schedule_figure
from memprof.units import format_bytes

#: Colours of the options, by the order their names first appear in the schedule.
OPTION_PALETTE = ("#2ca02c", "#17becf", "#9467bd", "#8c564b", "#bcbd22", "#e377c2", "#7f7f7f", "#1f77b4")
#: The Pareto figure's colour of ``selective`` (``ALGORITHM_COLORS`` has the others).
SELECTIVE_COLOR = "#d6616b"
COMPILE_COLOR = "#8c6d31"
COMPILE_NAME = "torch.compile (measured)"
#: The trace name :func:`schedule_figure` gives plain recorded forwards, and what it becomes beside options.
PLAIN_F_ALL, KEEP_ALL = "F_all", "F_all (keeps everything)"


def _stage_labels(stage_names: Sequence[str]) -> list[str]:
    return [*(plot_text(n) for n in stage_names), "loss"]


def option_bars(rows: pd.DataFrame, stage_names: Sequence[str], base_bytes: int = 0) -> list[dict[str, Any]]:
    """One bar trace per option name for the ``F_all`` rows that use an option.

    Args:
        rows: prediction rows with ``option > 0`` and the columns of
            :func:`dashboard.planning.with_option_columns` (``option_name``, ``option_saved_bytes``,
            ``option_recompute_ms``, ``stage_saved_bytes``).
        stage_names: labels of stages 1..L.
        base_bytes: what the step holds beside the chain, added to the memory in the hover.
    """
    labels = _stage_labels(stage_names)
    names = rows["option_name"].astype(str).to_numpy()
    peaks, after = memory_labels(rows, base_bytes)
    traces = []
    for position, name in enumerate(dict.fromkeys(names)):
        chosen = rows[names == name]
        start = chosen["start_ms"].to_numpy(dtype=float)
        stage = chosen["stage"].to_numpy(dtype=int)
        rows_at = np.flatnonzero(names == name)
        custom = [[labels[s - 1] if 0 < s <= len(labels) else str(s), f"F_all({s})[{o}]",
                   format_bytes(int(kept)), format_bytes(int(full)), float(ms), peaks[r], after[r]]
                  for s, o, kept, full, ms, r in zip(stage, chosen["option"].to_numpy(dtype=int),
                                                     chosen["option_saved_bytes"], chosen["stage_saved_bytes"],
                                                     chosen["option_recompute_ms"], rows_at)]
        shown = plot_text(name)
        traces.append({
            "type": "bar", "orientation": "h", "name": f"F_all [{shown}]", "y": stage, "base": start,
            "x": chosen["end_ms"].to_numpy(dtype=float) - start,
            "marker": {"color": OPTION_PALETTE[position % len(OPTION_PALETTE)], "line": {"width": 0}},
            "text": [shown] * len(stage), "textposition": "inside", "insidetextanchor": "middle",
            "textfont": {"color": "white", "size": 10}, "customdata": custom,
            "hovertemplate": ("%{customdata[1]} %{customdata[0]}: option " + shown + " keeps %{customdata[2]} "
                              "of %{customdata[3]}; B recomputes the rest first (%{customdata[4]:.3f} ms): "
                              "%{base:.3f} ms + %{x:.3f} ms<br>memory: up to %{customdata[5]} while it runs, "
                              "%{customdata[6]} after<extra></extra>"),
        })
    return traces


def schedule_figure_with_options(prediction: pd.DataFrame, stage_names: Sequence[str], base_bytes: int = 0) -> Figure:
    """:func:`dashboard.figures_planner.schedule_figure`, with each option's ``F_all`` in its own colour.

    Args:
        prediction: the simulator's frame (:func:`dashboard.planning.prediction_frame`), with the option
            columns (:func:`dashboard.planning.with_option_columns`) when some ``F_all`` uses an option.
        stage_names: labels of stages 1..L.
        base_bytes: what the step holds beside the chain, added to each operation's memory in the hover.
    """
    if "option_name" not in prediction.columns or not (prediction["option"].to_numpy() > 0).any():
        return schedule_figure(prediction, stage_names, base_bytes)
    chosen = prediction["option"].to_numpy() > 0
    figure = schedule_figure(prediction[~chosen], stage_names, base_bytes)
    data = [{**t, "name": KEEP_ALL} if t.get("name") == PLAIN_F_ALL else t for t in figure["data"]]
    layout = dict(figure["layout"])
    layout["title"] = {"text": "Schedule: operations over time, one row per stage; an F_all with a recomputation "
                               "option is coloured and labelled by it (its B recomputes first)"}
    layout["uniformtext"] = {"mode": "hide", "minsize": 8}  # a label that does not fit its bar is left out
    return {"data": [*data, *option_bars(prediction[chosen], stage_names, base_bytes)], "layout": layout}


def option_summary(rows: pd.DataFrame) -> str:
    """The options a schedule uses, one line each: ``F_all(3)[2] keep addmm: keeps 1 MiB of 3 MiB, ...``."""
    if "option_name" not in rows.columns:
        return ""
    lines = []
    for _, row in rows[rows["option"].to_numpy() > 0].iterrows():
        lines.append(f"F_all({int(row['stage'])})[{int(row['option'])}] {row['option_name']}: keeps "
                     f"{format_bytes(int(row['option_saved_bytes']))} of {format_bytes(int(row['stage_saved_bytes']))}, "
                     f"B recomputes {float(row['option_recompute_ms']):.3f} ms")
    return "\n".join(lines)


def compile_trace(points: Sequence[Any]) -> dict[str, Any]:
    """torch.compile's measured points as diamonds labelled with their ``activation_memory_budget``.

    x is ``step_peak_bytes`` (the whole step's measured peak), y the measured median step time.
    """
    ordered = sorted(points, key=lambda p: p.step_peak_bytes)
    reference = next((p for p in ordered if p.activation_memory_budget == 1.0), None)
    custom = []
    for p in ordered:
        more_flops = (f" ({p.flops / reference.flops - 1:+.1%} over budget 1.0)"
                      if reference is not None and reference.flops > 0 else "")
        more_time = (f" ({p.step_ms / reference.step_ms - 1:+.1%} over budget 1.0)"
                     if reference is not None and reference.step_ms > 0 else "")
        custom.append([f"{p.activation_memory_budget:g}", format_bytes(p.step_peak_bytes), format_bytes(p.held_bytes),
                       f"{p.flops:.3g}{more_flops}" if p.flops else "not counted", more_time])
    return {
        "type": "scatter", "mode": "markers+text", "name": COMPILE_NAME,
        "x": np.array([p.step_peak_bytes for p in ordered]), "y": np.array([p.step_ms for p in ordered]),
        "text": [f"budget {p.activation_memory_budget:g}" for p in ordered], "textposition": "top center",
        "textfont": {"color": COMPILE_COLOR, "size": 10},
        "marker": {"symbol": "diamond", "size": 11, "color": COMPILE_COLOR, "line": {"color": "white", "width": 1}},
        "customdata": custom,
        "hovertemplate": ("activation_memory_budget %{customdata[0]}<br>measured step peak %{customdata[1]} (the "
                          "whole step: what it starts with + the allocator's highest rise; the planner's points "
                          "are predicted whole-step peaks)<br>held for the backward %{customdata[2]}<br>"
                          "measured step time %{y:.3f} ms%{customdata[4]} (the whole step, optimizer and modules "
                          "outside the chain included; the planner's are the chain's predicted makespans)<br>"
                          "FLOPs %{customdata[3]}<extra>torch.compile</extra>"),
    }


def _x_range(data: Sequence[dict[str, Any]]) -> tuple[float, float]:
    xs = [np.asarray(t["x"], dtype=float) for t in data if "x" in t and len(t["x"])]
    if not xs:
        return 0.0, 0.0
    joined = np.concatenate(xs)
    return float(np.min(joined)), float(np.max(joined))


#: Algorithms whose schedules copy activations (or weights) to the host: they need a device-host link.
OFFLOAD_ALGORITHMS = ("offload", "offload+weights")
NEEDS_A_GPU = "needs a GPU"


def needs_a_gpu(trace: dict[str, Any]) -> dict[str, Any]:
    """An offload trace of a run without a device-host link: hollow grey markers, said in its name and hover.

    The planner prices offload on such a chain with its default link (``planner.DEFAULT_TRANSFER``); the points
    show what a GPU would gain, not a schedule this run's device can execute (the slider never offers them).
    """
    name = f"{trace.get('name', '')} ({NEEDS_A_GPU})"
    return {**trace, "name": name, "line": {**trace.get("line", {}), "color": "#aaaaaa"},
            "marker": {**trace.get("marker", {}), "color": "#999999", "symbol": "circle-open"},  # hollow: not offered
            "hovertemplate": str(trace.get("hovertemplate", "")).replace(
                "<extra>", "<br>needs a GPU: this run's device has no link to host memory; priced with the "
                "planner's default link<extra>")}


def pareto_with_options(points: pd.DataFrame, front_budgets: Sequence[float] | np.ndarray,
                        front_makespans: Sequence[float] | np.ndarray, front_algorithm: str = "rotor",
                        whole_step: bool = False, compile_points: Sequence[Any] = (),
                        compile_error: str = "", device_link: bool = True) -> Figure:
    """:func:`dashboard.figures_pareto.pareto_base` with ``selective``'s points and torch.compile's.

    Args:
        points: ``planner.algorithm_points`` (with ``selective`` rows when the chain has options).
        front_budgets: the slider's front's budgets (bytes).
        front_makespans: its optimal makespans (ms).
        front_algorithm: the DP of that front (``"rotor"`` or ``"selective"``), named in the legend.
        whole_step: whether the bytes are the whole training step's.
        compile_points: torch.compile's measured points (``CompilePoint``); drawn only on a whole-step figure.
        compile_error: why stored points could not be read, said on the figure.
        device_link: whether the run's device has a link to host memory (CUDA). Without one, the offload
            points (priced with the planner's default link) are drawn hollow and grey, named "needs a GPU".
    """
    figure = pareto_base(points, front_budgets, front_makespans, whole_step)
    color = SELECTIVE_COLOR if front_algorithm == "selective" else ALGORITHM_COLORS.get(front_algorithm, "#888888")
    data = []
    for trace in figure["data"]:
        if str(trace.get("name", "")).endswith("optimum by budget"):  # the front's line: named after its DP
            trace = {**trace, "name": f"{front_algorithm} optimum by budget",
                     "line": {**trace["line"], "color": color}}
        elif trace.get("name") == "selective":
            trace = {**trace, "line": {**trace["line"], "color": SELECTIVE_COLOR}, "marker": {
                **trace.get("marker", {}), "color": SELECTIVE_COLOR, "symbol": "triangle-up"}}
        elif not device_link and str(trace.get("name", "")) in OFFLOAD_ALGORITHMS:
            trace = needs_a_gpu(trace)
        data.append(trace)
    layout = dict(figure["layout"])
    notes = []
    if compile_points and whole_step:
        data.append(compile_trace(compile_points))
        low, high = _x_range(data)
        layout["xaxis"] = {**layout["xaxis"], **byte_axis("whole-step peak memory", high, bottom_bytes=low)}
    elif compile_points:
        notes.append("torch.compile's points are measured whole-step peaks: not drawn on this chain-only figure")
    if compile_error:
        notes.append(f"torch.compile's points left out: {plot_text(compile_error)}")
    if notes:
        layout["annotations"] = [{"xref": "paper", "yref": "paper", "x": 0, "y": 1.0 - 0.06 * i, "text": note,
                                  "showarrow": False, "xanchor": "left", "yanchor": "top", "font": {"size": 10}}
                                 for i, note in enumerate(notes)]
    return {"data": data, "layout": layout}
