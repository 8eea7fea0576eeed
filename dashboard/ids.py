"""Every component id of the dashboard, in one place, so layout, callbacks and browser tests agree."""

from __future__ import annotations

# Page frame
URL = "url"
TABS = "tabs"
SELECTED_RUNS = "selected-runs"  # dcc.Store: the chosen run names (at most two), client side
PLANNER_CHOICE = "planner-choice"  # dcc.Store: {run, container, budget_bytes} of the shown schedule
PLANNER_DRAWN = "planner-drawn"  # dcc.Store: {run, container, inputs} the Planner shows (dashboard.live_planner)
STATUS = "status"
RUN_PROBLEM = "run-problem"  # one line above every tab: what is wrong with the chosen run (damaged, interrupted)
LIVE_INTERVAL = "live-interval"  # dcc.Interval: on while the chosen run is still being written
LIVE_STAMP = "live-stamp"  # dcc.Store: the chosen run's modification stamp; changes when new parts land

# Tab values
TAB_RUNS = "tab-runs"
TAB_OVERVIEW = "tab-overview"
TAB_LAYERS = "tab-layers"
TAB_TIMELINE = "tab-timeline"
TAB_PLANNER = "tab-planner"
TAB_EXPORT = "tab-export"
TAB_VALUES: tuple[str, ...] = (TAB_RUNS, TAB_OVERVIEW, TAB_LAYERS, TAB_TIMELINE, TAB_PLANNER, TAB_EXPORT)

# Runs
RUNS_TABLE = "runs-table"
RUNS_EMPTY = "runs-empty"
RUNS_SELECTION = "runs-selection"

# Overview
OVERVIEW_HEADLINE = "overview-headline"
OVERVIEW_PEAKS = "overview-peaks"
OVERVIEW_BREAKDOWN = "overview-breakdown"
OVERVIEW_DETAIL = "overview-detail"  # how many iterations have detail
OVERVIEW_RANKS_BOX = "overview-ranks-box"  # shown only for the ranks of a distributed run
OVERVIEW_RANKS_TEXT = "overview-ranks-text"
OVERVIEW_RANKS = "overview-ranks"

# Layers
LAYERS_ITERATION = "layers-iteration"
LAYERS_DETAIL = "layers-detail"
LAYERS_SIZE = "layers-size"
LAYERS_TABLE = "layers-table"
LAYERS_TREE = "layers-tree"

# Timeline
TIMELINE_ITERATION = "timeline-iteration"
TIMELINE_DETAIL = "timeline-detail"
TIMELINE_GRAPH = "timeline-graph"
TIMELINE_INFO = "timeline-info"
TIMELINE_ZOOM = "timeline-zoom"  # dcc.Store: {run, iteration, range} of the last zoom
TIMELINE_TENSORS = "timeline-tensors"  # the tensors live at the clicked moment (a table)
TIMELINE_TENSORS_NOTE = "timeline-tensors-note"

# Planner
PLANNER_CONTAINER = "planner-container"
PLANNER_BUDGET = "planner-budget"
PLANNER_BUDGET_TEXT = "planner-budget-text"
PLANNER_MAKESPAN = "planner-makespan"
PLANNER_PEAK = "planner-peak"
PLANNER_MESSAGE = "planner-message"
PLANNER_SCHEDULE_TEXT = "planner-schedule-text"
PLANNER_SCHEDULE_GRAPH = "planner-schedule-graph"
PLANNER_TIMELINE_GRAPH = "planner-timeline-graph"  # unused: the memory is drawn under the schedule (one time axis)
PLANNER_PARETO_GRAPH = "planner-pareto-graph"
PLANNER_MEASURED = "planner-measured"
PLANNER_VIEWS = "planner-views"  # dcc.Store: every slider position of the chain, drawn in the page (slider_views)
PLANNER_VIEWS_KEY = "planner-views-key"  # dcc.Store: [run, chain] the views are of (so they are sent once)
PLANNER_REQUEST = "planner-request"  # dcc.Store: a position the views lack, asked of the server
PLANNER_SERVED = "planner-served"  # dcc.Store: the server's answer to that request

# Export
EXPORT_SUMMARY = "export-summary"
EXPORT_JSON_BUTTON = "export-json-button"
EXPORT_PY_BUTTON = "export-py-button"
EXPORT_JSON_DOWNLOAD = "export-json-download"
EXPORT_PY_DOWNLOAD = "export-py-download"
EXPORT_MESSAGE = "export-message"
