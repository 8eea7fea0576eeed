"""Callbacks of the Planner and Export tabs: chain picker, slider bounds, measured runs, downloads.

The slider never solves: what it shows (:func:`planner_view`) reads the cached Pareto front with ``schedule_at``
and asks the simulator for the predicted timeline. The page shows every slider position from the chain's views,
made once (:mod:`dashboard.callbacks_slider`, :mod:`dashboard.slider_views`), and asks :func:`planner_view` only
for a position they lack.

For a chain found in a run (with step costs) the slider, the texts and the figures speak the whole training
step's memory, what the device has; the chain's own share is said beside it.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import dash
from dash import Input, Output, State, dcc, html

import planner
from dashboard import ids
from dashboard.data import VIEW_ERRORS, TraceStore
from dashboard.figures import empty_figure
from dashboard.figures_planner import memory_figure
from dashboard.measured import MeasuredRun, compare_measured, measured_runs
from dashboard.planning import SLIDER_STEPS, PlannerModel, container_choices, default_budget, planner_model
from dashboard.slider_views import budget_text, matching, pareto_at, schedule_view
from memprof.units import format_bytes

#: Chain picker value for the chain the planner finds by itself; containers are ``"module:<name>"``.
AUTO = "auto"
_MODULE_PREFIX = "module:"
#: Name of the downloaded Python file, the module name its usage lines import.
PYTHON_FILENAME = "apply_schedule.py"
_NO_RUN = "Choose a run on the Runs tab."


def container_of(choice: str | None) -> str | None:
    """The container name a chain-picker value names, or ``None`` for the auto-detected chain."""
    if choice and choice.startswith(_MODULE_PREFIX):
        return choice[len(_MODULE_PREFIX):]
    return None


def chain_options(store: TraceStore, names: list[str] | None) -> tuple[list[dict], str]:
    """Chain-picker options: the auto-detected chain, then every container of the first chosen run."""
    options = [{"label": "auto-detected chain", "value": AUTO}]
    if names:
        with contextlib.suppress(*VIEW_ERRORS):
            options += [{"label": container_label(m), "value": _MODULE_PREFIX + m}
                        for m in container_choices(store.model_layers(names[0]))]
    return options, AUTO


def container_label(name: str) -> str:
    """How the chain picker names a container (the root's name is empty)."""
    return f"children of {name}" if name else "children of the model itself (the root)"


def describe_chain(model: PlannerModel) -> str:
    """Which modules the chain covers, and what its budgets count."""
    names = model.chain.module_names
    shown = ", ".join(names[:6]) + (f", ... ({len(names)} stages)" if len(names) > 6 else "")
    step = model.step
    if step is None:
        return (f"Chain {model.chain.name}: {shown}; the budget counts the chain's activations only and excludes "
                f"{format_bytes(model.model_state_bytes)} of model state.")
    return (f"Chain {model.chain.name}: {shown}. Budgets are the whole training step's memory: "
            f"{format_bytes(step.base_bytes)} stays beside the chain ({step.explain_base()}), and no schedule goes "
            f"below {format_bytes(step.floor_bytes)}.")


def _options_note(model: PlannerModel) -> str:
    """What the stages' recomputation options change, and whether torch.compile's points are shown."""
    blocks = sum(1 for stage in model.chain.stages if stage.options)
    note = ""
    if blocks:
        have = "1 stage has" if blocks == 1 else f"{blocks} stages have"
        note = (f" {have} recomputation options (from the run's planning pass): the slider reads "
                f"selective's optimum, where each recorded forward keeps everything or one option.")
    if model.compile_points:
        note += f" The Pareto figure shows torch.compile's {len(model.compile_points)} measured points."
    return note


def _floor_note(model: PlannerModel) -> str:
    """Why the minimum is where it is, when what lies outside the chain sets it."""
    step = model.step
    if step is None or model.min_budget_bytes > step.floor_bytes:
        return ""
    return f" The minimum is set outside the chain: {step.explain_floor()}."


def planner_bounds(store: TraceStore, names: list[str] | None, choice: str | None) -> tuple[Any, ...]:
    """The slider's range and start for the chosen chain: min feasible budget to store-all.

    Returns:
        ``(min, max, step, marks, value, disabled, message)`` for the slider and the message line.
    """
    if not names:
        return 0, 1, 0.01, None, 0.5, True, _NO_RUN
    try:
        model = planner_model(store, names[0], container_of(choice))
    except VIEW_ERRORS as exc:  # a damaged or unreadable run: its one problem line (dashboard.live), once
        return 0, 1, 0.01, None, 0.5, True, store.problem(names[0]) or f"No plan for {names[0]}: {exc}"
    low, high = model.min_budget_bytes, model.max_budget_bytes
    if high <= low:
        marks = {str(low): f"{format_bytes(low)} (store-all)"}
        return (low, low, 1, marks, low, True, describe_chain(model) + " Store-all is already the minimum."
                + _floor_note(model) + _options_note(model))
    step = (high - low) / SLIDER_STEPS
    marks = {str(low): format_bytes(low), str(high): format_bytes(high)}
    span = f" Budgets from {format_bytes(low)} (the minimum feasible) to {format_bytes(high)} (store-all)."
    message = describe_chain(model) + span + _floor_note(model) + _options_note(model)
    return low, high, step, marks, default_budget(model), False, message


def _run_id(store: TraceStore, name: str) -> str:
    return str(store.meta(name).get("run_id", name))


def comparisons(store: TraceStore, name: str) -> list[MeasuredRun | tuple[str, str]]:
    """Measured runs of schedules made from run ``name``; an unreadable one as ``(name, error)``."""
    folder_stamp = store.traces_dir.stat().st_mtime_ns if store.traces_dir.is_dir() else 0
    run_id = _run_id(store, name)
    found = store.cache.get_or_build(("measured-of", str(store.traces_dir), folder_stamp, run_id),
                                     lambda: tuple(measured_runs(store, run_id)))
    out: list[MeasuredRun | tuple[str, str]] = []
    for measured in found:
        try:
            out.append(compare_measured(store, measured))
        except VIEW_ERRORS as exc:
            out.append((measured, str(exc)))
    return out


def _error_sentence(run: MeasuredRun) -> str:
    c = run.comparison
    what = "whole-step peak" if c.whole_step else "activation peak"
    return (f"{run.name}: {what} predicted {format_bytes(c.predicted_peak_bytes)}, measured "
            f"{format_bytes(c.measured_peak_bytes)} ({c.peak_error:+.1%}); time predicted "
            f"{c.predicted_makespan_ms:.3f} ms, measured {c.measured_step_ms:.3f} ms ({c.time_error:+.1%}).")


def planner_view(store: TraceStore, names: list[str] | None, choice: str | None,
                 budget: float | None) -> tuple[Any, ...]:
    """What the budget slider shows: the optimal schedule at ``budget`` and its prediction.

    Returns:
        ``(budget text, peak text, makespan text, operations text, schedule-and-memory figure, Pareto figure,
        planner choice)``; the choice (run, container, budget) feeds the Export tab. The schedule and its
        predicted memory share one time axis (:func:`dashboard.figures_schedule.planner_figure`). The page
        shows the same from the chain's views (:func:`dashboard.callbacks_slider.planner_views`) where it has them.
    """
    if not names:
        blank = empty_figure(_NO_RUN)
        return "", "", "", "", blank, blank, None
    try:
        model = planner_model(store, names[0], container_of(choice))
    except VIEW_ERRORS as exc:
        if store.problem(names[0]):  # said once, by the problem line and the message above the slider
            return "", "", "", "", empty_figure(""), empty_figure(""), None
        message = f"No plan for {names[0]}: {exc}"
        failed = empty_figure(message)
        return message, "", "", "", failed, failed, None
    budget_bytes = model.clamp(budget)
    schedule = model.front.schedule_at(budget_bytes)
    view = schedule_view(model, schedule, matching(comparisons(store, names[0]), schedule, model.whole_step))
    picked = {"run": names[0], "container": container_of(choice), "budget_bytes": budget_bytes}
    return (budget_text(model, budget_bytes), view.peak_text, view.makespan_text, view.ops_text,
            view.figure(budget_bytes), pareto_at(model, view, budget_bytes), picked)


def measured_view(store: TraceStore, names: list[str] | None) -> list[Any]:
    """One block per measured run of a schedule from the first chosen run: errors and both timelines."""
    if not names:
        return [html.P(_NO_RUN)]
    try:
        found = comparisons(store, names[0])
    except VIEW_ERRORS as exc:
        return [html.P(store.problem(names[0]) or f"Cannot list measured runs: {exc}")]
    if not found:
        return [html.P("No schedule made from this run has been executed and measured yet "
                       "(a measured run is a run whose meta.json names this run as its source_run).")]
    blocks: list[Any] = []
    for item in found:
        if not isinstance(item, MeasuredRun):
            blocks.append(html.P(f"{item[0]}: cannot compare: {item[1]}", className="message"))
            continue
        whole = " (whole training step)" if item.whole_step else " (activations)"
        figure = memory_figure(item.predicted, item.schedule.budget_bytes, [(item.name, item.measured)],
                               title=f"{item.schedule.algorithm} schedule: predicted and measured{whole}",
                               base_bytes=item.base_bytes, floor_bytes=item.floor_bytes)
        blocks.append(html.Div(className="measured", children=[
            html.P(_error_sentence(item)), dcc.Graph(figure=figure, config={"displaylogo": False})]))
    return blocks


def current_schedule(store: TraceStore, choice: dict | None, names: list[str] | None) -> planner.Schedule:
    """The schedule the Planner shows (or, before it was opened, the first run's at the default budget)."""
    if choice and isinstance(choice, dict) and choice.get("run"):
        run, container, budget = str(choice["run"]), choice.get("container"), choice.get("budget_bytes")
    elif names:
        run, container, budget = names[0], None, None
    else:
        raise LookupError("no run chosen: choose a run on the Runs tab and a budget on the Planner tab")
    model = planner_model(store, run, container if isinstance(container, str) else None)
    schedule = model.front.schedule_at(model.clamp(budget))
    prediction = planner.simulate(model.chain, schedule)
    return schedule.with_prediction(prediction.peak_bytes, prediction.makespan_ms)


def _file_stem(schedule: planner.Schedule) -> str:
    chain = re.sub(r"[^A-Za-z0-9._-]+", "_", schedule.chain.name or "chain").strip("_") or "chain"
    return f"schedule_{chain}_{schedule.algorithm}_{schedule.budget_bytes}"


def export_summary(store: TraceStore, choice: dict | None, names: list[str] | None) -> str:
    """What the Export buttons will download."""
    try:
        schedule = current_schedule(store, choice, names)
    except (*VIEW_ERRORS, LookupError) as exc:
        problem = store.problem(names[0]) if names else None
        return problem or f"Nothing to export yet: {exc}"
    run = choice.get("run") if isinstance(choice, dict) and choice.get("run") else (names or ["?"])[0]
    # a schedule from the front has a budget and, once simulated (current_schedule), a peak
    budget_bytes, chain_peak = schedule.budget_bytes or 0, schedule.predicted_peak_bytes or 0
    if schedule.predicted_step_peak_bytes is not None:
        budget = f"{format_bytes(budget_bytes)} for the whole step"
        peak = (f"{format_bytes(schedule.predicted_step_peak_bytes)} for the whole step (the chain's own "
                f"{format_bytes(chain_peak)})")
    else:
        budget, peak = format_bytes(budget_bytes), format_bytes(chain_peak)
    options = sum(1 for op in schedule.ops if op.option)
    chosen = f" {options} recorded forwards keep less than everything (recomputation options)." if options else ""
    return (f"{schedule.algorithm} schedule of run {run}, chain {schedule.chain.name}, at budget {budget}: "
            f"{len(schedule.ops)} operations, predicted peak {peak}, makespan {schedule.predicted_makespan_ms:.3f} ms."
            + chosen)


def export_json(store: TraceStore, choice: dict | None, names: list[str] | None) -> dict:
    """The download of the current schedule as JSON (``Schedule.to_json``)."""
    schedule = current_schedule(store, choice, names)
    return dcc.send_string(schedule.to_json(), f"{_file_stem(schedule)}.json")


def export_python(store: TraceStore, choice: dict | None, names: list[str] | None) -> dict:
    """The download of the current schedule as the planner's standalone Python file."""
    schedule = current_schedule(store, choice, names)
    # The generated file documents its use as `from apply_schedule import apply_schedule`.
    return dcc.send_string(planner.export_python(schedule), PYTHON_FILENAME)


def register(app: dash.Dash, store: TraceStore) -> None:
    """Wires the Planner and Export callbacks."""

    @app.callback(Output(ids.PLANNER_CONTAINER, "options"), Output(ids.PLANNER_CONTAINER, "value"),
                  Input(ids.SELECTED_RUNS, "data"))
    def _chains(names):
        return chain_options(store, names)

    @app.callback(Output(ids.PLANNER_BUDGET, "min"), Output(ids.PLANNER_BUDGET, "max"),
                  Output(ids.PLANNER_BUDGET, "step"), Output(ids.PLANNER_BUDGET, "marks"),
                  Output(ids.PLANNER_BUDGET, "value"), Output(ids.PLANNER_BUDGET, "disabled"),
                  Output(ids.PLANNER_MESSAGE, "children"),
                  Input(ids.SELECTED_RUNS, "data"), Input(ids.PLANNER_CONTAINER, "value"))
    def _bounds(names, choice):
        return planner_bounds(store, names, choice)

    @app.callback(Output(ids.PLANNER_MEASURED, "children"), Input(ids.SELECTED_RUNS, "data"))
    def _measured(names):
        return measured_view(store, names)

    # made when the Export tab opens, where it is read: the slider's choice is a State, so a slider move (drawn in
    # the page) asks the server nothing
    @app.callback(Output(ids.EXPORT_SUMMARY, "children"), Input(ids.TABS, "value"), Input(ids.SELECTED_RUNS, "data"),
                  State(ids.PLANNER_CHOICE, "data"))
    def _summary(tab, names, choice):
        if tab != ids.TAB_EXPORT:
            raise dash.exceptions.PreventUpdate
        return export_summary(store, choice, names)

    @app.callback(Output(ids.EXPORT_JSON_DOWNLOAD, "data"), Output(ids.EXPORT_MESSAGE, "children", allow_duplicate=True),
                  Input(ids.EXPORT_JSON_BUTTON, "n_clicks"), State(ids.PLANNER_CHOICE, "data"),
                  State(ids.SELECTED_RUNS, "data"), prevent_initial_call=True)
    def _download_json(_clicks, choice, names):
        return _download(export_json, store, choice, names)

    @app.callback(Output(ids.EXPORT_PY_DOWNLOAD, "data"), Output(ids.EXPORT_MESSAGE, "children", allow_duplicate=True),
                  Input(ids.EXPORT_PY_BUTTON, "n_clicks"), State(ids.PLANNER_CHOICE, "data"),
                  State(ids.SELECTED_RUNS, "data"), prevent_initial_call=True)
    def _download_python(_clicks, choice, names):
        return _download(export_python, store, choice, names)


def _download(build: Any, store: TraceStore, choice: dict | None, names: list[str] | None) -> tuple[Any, str]:
    try:
        payload = build(store, choice, names)
    except (*VIEW_ERRORS, LookupError) as exc:
        return dash.no_update, f"Cannot export: {exc}"
    return payload, f"Downloaded {payload['filename']}."
