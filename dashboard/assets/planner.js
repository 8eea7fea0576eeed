// The Planner's budget slider, drawn in the page (dashboard/slider_views.py, dashboard/callbacks_slider.py).
//
// The server sends every slider position of the chain once (the views: each distinct schedule's figure and
// texts, and each position's budget text and the layout keys that move with the budget). On release,
// plannerView picks the position apart here: no request, and the figures get the same trace objects for the
// same schedule, so plotly redraws only the layout that moved (the budget line and note, the memory axis's
// ticks, the Pareto star). A position the views lack (they are not there yet, they are of another run, chain
// or planner model, or the chain was too long to hold them all) is asked of the server: plannerView sets the
// request, and servedView draws the answer if the slider still shows that position. viewsArrived draws the
// position shown when the views arrive (they are a State of plannerView, so no release waits for them).
(function () {
    "use strict";
    const clientside = (window.dash_clientside = window.dash_clientside || {});
    const OUTPUTS = 7; // budget, peak, makespan and operations texts, the two figures, the Export's choice

    function runOf(names) {
        return names && names.length ? names[0] : null;
    }

    // The views' position of a slider value (the slider reports min + k * step).
    function positionOf(views, value) {
        const last = views.positions.length - 1;
        const k = views.step > 0 ? Math.round((Number(value) - views.min) / views.step) : 0;
        return Math.min(Math.max(k, 0), last);
    }

    // Whether the views are of this run, chain and planner model (a live run's model changes under the page).
    function current(views, run, choice, drawn) {
        return Boolean(views && views.positions && views.run === run && views.choice === choice
            && (!drawn || !drawn.inputs || drawn.inputs === views.inputs));
    }

    // The seven outputs at slider value ``value`` from the views, or null when they lack that position.
    function fromViews(views, run, choice, drawn, value) {
        if (typeof value !== "number" || !current(views, run, choice, drawn)) {
            return null;
        }
        const k = positionOf(views, value);
        const at = views.positions[k];
        if (!at) {
            return null;
        }
        const shown = views.schedules[at.schedule];
        // top-level layout keys replaced, traces shared: plotly.react keeps the traces it has drawn
        const figure = {data: shown.figure.data, layout: Object.assign({}, shown.figure.layout, at.figure)};
        const pareto = {data: views.pareto.data, layout: Object.assign({}, views.pareto.layout, at.pareto)};
        const choiceOut = {run: run, container: views.container, budget_bytes: views.budgets[k]};
        return [at.budget_text, shown.texts[0], shown.texts[1], shown.texts[2], figure, pareto, choiceOut];
    }

    // Whether the server's answer is for this run, chain and slider value.
    function answers(served, run, choice, value) {
        return Boolean(served && served.key && served.key[0] === run && served.key[1] === choice
            && served.key[2] === value);
    }

    function unchanged(count) {
        return new Array(count).fill(clientside.no_update);
    }

    clientside.memprof = Object.assign(clientside.memprof || {}, {
        // Outputs: the seven, then the request for the server (when the views lack the position).
        plannerView: function (value, names, choice, views, drawn, served) {
            const run = runOf(names);
            const shown = fromViews(views, run, choice, drawn, value);
            if (shown) {
                return shown.concat([clientside.no_update]);
            }
            if (answers(served, run, choice, value)) {
                return served.outputs.concat([clientside.no_update]);
            }
            return unchanged(OUTPUTS).concat([{run: run, choice: choice, value: value}]);
        },
        // The server's answer, drawn only if the slider still shows its position and the views do not.
        servedView: function (served, value, names, choice, views, drawn) {
            const run = runOf(names);
            if (!answers(served, run, choice, value) || fromViews(views, run, choice, drawn, value)) {
                return unchanged(OUTPUTS);
            }
            return served.outputs;
        },
        // The views arrived (or changed): the position the slider shows, drawn from them.
        viewsArrived: function (views, value, names, choice, drawn) {
            return fromViews(views, runOf(names), choice, drawn, value) || unchanged(OUTPUTS);
        },
    });
})();
