import time, duckdb
run = "/tmp/ranks_bench_try/run"
src = f"read_parquet('{run}/rank=*/iterations.parquet/*.parquet', hive_partitioning = true)"
qs = {
"distinct": f"SELECT rank, count(DISTINCT iteration) FROM {src} GROUP BY rank",
"count": f"SELECT rank, count(*), max(peak_allocated_bytes) FROM {src} GROUP BY rank",
"argmin_struct": f"SELECT rank, arg_min(iteration, (-peak_allocated_bytes, iteration)) FROM {src} GROUP BY rank",
"argmin_struct_mod": f"SELECT rank, arg_min(peak_module, (-peak_allocated_bytes, iteration)) FROM {src} GROUP BY rank",
"qualify": f"""SELECT rank, iteration, peak_allocated_bytes, peak_module, peak_phase FROM {src}
 QUALIFY row_number() OVER (PARTITION BY rank ORDER BY peak_allocated_bytes DESC, iteration) = 1""",
"join": f"""WITH per_rank AS (SELECT rank, max(peak_allocated_bytes) AS peak_allocated_bytes, count(DISTINCT iteration) AS iterations,
   max(peak_reserved_bytes) AS peak_reserved_bytes FROM {src} GROUP BY rank)
 SELECT r.rank, r.peak_allocated_bytes, min(i.iteration) AS peak_iteration, first(i.peak_module ORDER BY i.iteration) AS peak_module,
  first(i.peak_phase ORDER BY i.iteration) AS peak_phase, r.iterations, r.peak_reserved_bytes
 FROM per_rank r JOIN {src} i ON i.rank = r.rank AND i.peak_allocated_bytes = r.peak_allocated_bytes
 GROUP BY ALL ORDER BY r.rank""",
"distinct_pairs": f"SELECT rank, count(*) FROM (SELECT DISTINCT rank, iteration FROM {src}) GROUP BY rank",
}
for k,q in qs.items():
    ts=[]
    for i in range(3):
        t=time.perf_counter(); r=duckdb.sql(q).fetchall(); ts.append(time.perf_counter()-t)
    print(k, [round(x,3) for x in ts], r[:1])
