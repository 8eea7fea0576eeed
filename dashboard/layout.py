"""The page: one tab per view. Static; callbacks fill it (see :mod:`dashboard.callbacks`).

Names from traces only ever reach the page as component properties (table cells, dropdown labels,
text children), which Dash renders as text: nothing here turns data into HTML or Markdown.
"""

from __future__ import annotations

import warnings
from typing import Any

from dash import dash_table, dcc, html
from dash.dash_table.Format import Format
from dash.development.base_component import Component

from dashboard import ids
from dashboard.drilldown import TENSOR_COLUMNS
from dashboard.runs import runs_table_style
from dashboard.tables import byte_text_key

#: Lines a user adds to a training loop to make a first trace.
FIRST_TRACE_HELP = """\
from memprof import MemoryProfiler

profiler = MemoryProfiler(model, optimizer, out_dir="{folder}")  # once, before training
for inputs, targets in loader:
    loss = criterion(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    profiler.record_stats()                      # at the end of every iteration
profiler.close()                                 # writes {folder}/<run>/
"""

#: How often the page looks for new iterations of a run still being written (ms).
LIVE_REFRESH_MS = 2000

#: The two lines that apply a downloaded ``apply_schedule.py`` (see ``planner.export.files``).
EXPORT_USAGE = "from apply_schedule import apply_schedule\nmodel = apply_schedule(model)\n"

RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "run"), ("kind", "kind"), ("state", "state"), ("model", "model"), ("device", "device"), ("created", "created"),
    ("rank", "rank"), ("iterations", "iterations"), ("peak", "peak allocated"), ("error", "error"),
)
LAYER_TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("module", "module"), ("kind", "class"), ("weight_bytes", "weights"),
    ("weight_grad_bytes", "weight grads"), ("feature_map_bytes", "feature maps"),
    ("weight_copy_bytes", "weight copies"), ("comm_buffer_bytes", "comm buffers"), ("output_bytes", "output"),
    ("saved_bytes", "saved"), ("forward_ms", "forward (ms)"),
    ("backward_ms", "backward (ms)"),
)
TREE_SIZES: tuple[tuple[str, str], ...] = (
    ("weight_bytes", "weights"), ("feature_map_bytes", "feature maps"), ("saved_bytes", "saved for backward"),
    ("output_bytes", "outputs"), ("weight_grad_bytes", "weight grads"), ("weight_copy_bytes", "weight copies"),
)
_TABLE_STYLE = {"overflowX": "auto"}
_CELL_STYLE = {"fontFamily": "monospace", "fontSize": "13px", "padding": "2px 8px", "textAlign": "left"}


def data_table(**props: Any) -> Component:
    """A ``dash_table.DataTable`` without Dash 4's notice that it will move to a separate package.

    It is still Dash's built-in sortable, filterable table, and the dashboard stays on it until it
    is removed; the notice would otherwise appear every time a page is built.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*dash_table\.DataTable will be removed",
                                category=DeprecationWarning)
        return dash_table.DataTable(**props)  # type: ignore[attr-defined]  # made when dash_table is imported


def _runs_tab() -> dcc.Tab:
    columns = [{"name": label, "id": key, **({"type": "numeric"} if key == "iterations" else {})}
               for key, label in RUN_COLUMNS]
    # sorted on the server by the numbers behind the binary units (dashboard.tables)
    table = data_table(
        id=ids.RUNS_TABLE, columns=columns, data=[],
        row_selectable="multi", selected_rows=[], sort_action="custom", sort_by=[], filter_action="native",
        page_size=50, **runs_table_style(),  # measured runs indented under their source, within 1600 px
    )
    return dcc.Tab(label="Runs", value=ids.TAB_RUNS, children=[
        html.P("Tick one run to look at it, or two to compare them. The first ticked run is the one every tab shows."),
        html.Div(id=ids.RUNS_EMPTY),
        table,
        html.P(id=ids.RUNS_SELECTION, className="note"),
    ])


def _overview_tab() -> dcc.Tab:
    return dcc.Tab(label="Overview", value=ids.TAB_OVERVIEW, children=[
        html.H3(id=ids.OVERVIEW_HEADLINE, className="headline"),
        html.P(id=ids.OVERVIEW_DETAIL, className="note"),
        dcc.Graph(id=ids.OVERVIEW_PEAKS, config={"displaylogo": False}),
        dcc.Graph(id=ids.OVERVIEW_BREAKDOWN, config={"displaylogo": False}),
        html.Div(id=ids.OVERVIEW_RANKS_BOX, style={"display": "none"}, children=[
            html.H3("Ranks"),
            html.P(id=ids.OVERVIEW_RANKS_TEXT, className="note"),
            dcc.Graph(id=ids.OVERVIEW_RANKS, config={"displaylogo": False}),
        ]),
    ])


def _layers_tab() -> dcc.Tab:
    columns = []
    for key, label in LAYER_TABLE_COLUMNS:
        column: dict = {"name": label, "id": key}
        if key.endswith("_bytes"):  # shown in binary units, sorted by the bytes (dashboard.tables)
            column.update(id=byte_text_key(key), type="text")
        elif key.endswith("_ms"):
            column.update(type="numeric", format=Format(precision=3, scheme="f"))
        columns.append(column)
    return dcc.Tab(label="Layers", value=ids.TAB_LAYERS, children=[
        html.Div(className="controls", children=[
            html.Label("iteration"), dcc.Dropdown(id=ids.LAYERS_ITERATION, clearable=False, className="picker"),
            html.Label("size boxes by"),
            dcc.RadioItems(id=ids.LAYERS_SIZE, options=[{"label": lbl, "value": key} for key, lbl in TREE_SIZES],
                           value="weight_bytes", inline=True),
        ]),
        html.P(id=ids.LAYERS_DETAIL, className="note"),
        data_table(id=ids.LAYERS_TABLE, columns=columns, data=[], sort_action="custom", sort_by=[],
                             filter_action="native", page_size=25, style_table=_TABLE_STYLE, style_cell=_CELL_STYLE),
        dcc.Graph(id=ids.LAYERS_TREE, config={"displaylogo": False}),
    ])


def _timeline_tab() -> dcc.Tab:
    return dcc.Tab(label="Timeline", value=ids.TAB_TIMELINE, children=[
        html.Div(className="controls", children=[
            html.Label("iteration"), dcc.Dropdown(id=ids.TIMELINE_ITERATION, clearable=False, className="picker"),
        ]),
        html.P(id=ids.TIMELINE_DETAIL, className="note"),
        html.P(id=ids.TIMELINE_INFO, className="note"),
        dcc.Graph(id=ids.TIMELINE_GRAPH, config={"displaylogo": False}),
        # a click on the timeline lists the tensors alive then (dashboard.drilldown)
        html.P(id=ids.TIMELINE_TENSORS_NOTE, className="note"),
        data_table(id=ids.TIMELINE_TENSORS, columns=[{"name": label, "id": key} for key, label in TENSOR_COLUMNS],
                   data=[], tooltip_data=[], tooltip_duration=None, page_size=25, style_table=_TABLE_STYLE,
                   style_cell=_CELL_STYLE),
    ])


def _planner_tab() -> dcc.Tab:
    return dcc.Tab(label="Planner", value=ids.TAB_PLANNER, children=[
        html.Div(className="controls", children=[
            html.Label("chain"),
            dcc.Dropdown(id=ids.PLANNER_CONTAINER, clearable=False, className="picker wide"),
        ]),
        html.P(id=ids.PLANNER_MESSAGE, className="message"),
        html.Label("memory budget, from the minimum feasible to store-all (for a chain found in a run: the whole "
                   "training step's memory, what the device has)"),
        html.Div(className="slider", children=[
            # the handle shows its budget in binary units while dragged (assets/units.js); the figures
            # follow on release
            dcc.Slider(id=ids.PLANNER_BUDGET, min=0, max=1, value=0.5, step=0.01, marks=None,
                       allow_direct_input=False, updatemode="mouseup",
                       tooltip={"always_visible": True, "placement": "top", "transform": "formatBytes"}),
        ]),
        html.Div(className="figures-row", children=[
            html.Div(id=ids.PLANNER_BUDGET_TEXT, className="stat"),
            html.Div(id=ids.PLANNER_PEAK, className="stat"),
            html.Div(id=ids.PLANNER_MAKESPAN, className="stat"),
        ]),
        html.Details(open=False, children=[
            html.Summary("operations"), html.Pre(id=ids.PLANNER_SCHEDULE_TEXT, className="schedule"),
        ]),
        dcc.Graph(id=ids.PLANNER_SCHEDULE_GRAPH, config={"displaylogo": False}),  # with its memory, one time axis
        dcc.Graph(id=ids.PLANNER_PARETO_GRAPH, config={"displaylogo": False}),
        html.H3("Measured runs of schedules from this run"),
        html.Div(id=ids.PLANNER_MEASURED),
    ])


def _export_tab() -> dcc.Tab:
    return dcc.Tab(label="Export", value=ids.TAB_EXPORT, children=[
        html.P(id=ids.EXPORT_SUMMARY),
        html.Button("Download schedule (JSON)", id=ids.EXPORT_JSON_BUTTON, n_clicks=0),
        html.Button("Download Python (apply_schedule.py)", id=ids.EXPORT_PY_BUTTON, n_clicks=0),
        html.P(id=ids.EXPORT_MESSAGE, className="message"),
        html.P("The Python file needs nothing but torch. Save it beside your training script and add:"),
        html.Pre(EXPORT_USAGE),
        dcc.Download(id=ids.EXPORT_JSON_DOWNLOAD),
        dcc.Download(id=ids.EXPORT_PY_DOWNLOAD),
    ])


def build_layout(traces_dir: str) -> html.Div:
    """The whole page for a traces folder (the folder is shown, never taken from the browser)."""
    return html.Div(className="page", children=[
        dcc.Location(id=ids.URL, refresh=False),
        dcc.Store(id=ids.SELECTED_RUNS, data=[]),
        dcc.Store(id=ids.PLANNER_CHOICE, data=None),
        # the budget slider's positions, drawn in the page (dashboard.callbacks_slider), and the server's answers
        *(dcc.Store(id=store, data=None) for store in (ids.PLANNER_VIEWS, ids.PLANNER_VIEWS_KEY,
                                                       ids.PLANNER_REQUEST, ids.PLANNER_SERVED)),
        dcc.Store(id=ids.PLANNER_DRAWN, data=None),  # a live run's planner inputs, redrawn when they change
        dcc.Store(id=ids.TIMELINE_ZOOM, data=None),
        dcc.Store(id=ids.LIVE_STAMP, data=None),
        # on only while the chosen run is being written (dashboard.live); each tick reads only new parts
        dcc.Interval(id=ids.LIVE_INTERVAL, interval=LIVE_REFRESH_MS, disabled=True),
        html.Header(children=[html.H1("memprof"), html.Span(f"traces: {traces_dir}", className="note")]),
        html.Div(id=ids.STATUS, className="message"),
        html.P(id=ids.RUN_PROBLEM, className="message run-problem"),  # shown above every tab, the same line
        dcc.Tabs(id=ids.TABS, value=ids.TAB_RUNS, children=[
            _runs_tab(), _overview_tab(), _layers_tab(), _timeline_tab(), _planner_tab(), _export_tab(),
        ]),
    ])


def first_trace_help(traces_dir: str) -> html.Div:
    """What an empty folder shows: the lines that make a first trace."""
    return html.Div(className="empty", children=[
        html.H3(f"No runs in {traces_dir} yet."),
        html.P("Add these lines to a training loop, run it, then reload this page:"),
        html.Pre(FIRST_TRACE_HELP.format(folder=traces_dir)),
    ])
