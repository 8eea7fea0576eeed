// Binary units in the browser, as memprof.units.format_bytes writes them on the server ("17.9 MiB"):
// the budget slider's tooltip shows its value in them while the handle is dragged (dcc.Slider's
// tooltip.transform names a function of window.dccFunctions).
window.dccFunctions = window.dccFunctions || {};
window.dccFunctions.formatBytes = function (value) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let size = Math.abs(Number(value));
    let power = 0;
    while (size >= 1024 && power < units.length - 1) {
        size /= 1024;
        power += 1;
    }
    const sign = Number(value) < 0 ? "-" : "";
    return power === 0 ? sign + Math.round(size) + " B" : sign + size.toFixed(1) + " " + units[power];
};
