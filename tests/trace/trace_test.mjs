// Loads traces that shardsim writes into Perfetto's real trace processor (v20.1, WebAssembly)
// and checks what it imported with SQL, plus what the importer does not check (strictly
// nested slices per track, complete JSON, byte-identical reruns).
// Run: SHARDSIM_BINARY=build/shardsim node --test tests/trace/trace_test.mjs
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import test, { after } from 'node:test';
import { fileURLToPath } from 'node:url';

import { loadTrace, summarize } from './perfetto_check.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const binary = process.env.SHARDSIM_BINARY || path.join(root, 'build', 'shardsim');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'shardsim-trace-'));
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function simulate(config, name) {
  const trace = path.join(tmp, `${name}.json`);
  execFileSync(binary, ['run', path.join(root, config), '--trace', trace], { stdio: 'pipe' });
  return trace;
}

// Every pair of X slices on one (pid, tid) either nests or is disjoint.
function assertStrictNesting(trace) {
  const doc = JSON.parse(fs.readFileSync(trace, 'utf8'));
  const tracks = new Map();
  for (const e of doc.traceEvents) {
    if (e.ph !== 'X') continue;
    const key = `${e.pid}/${e.tid}`;
    if (!tracks.has(key)) tracks.set(key, []);
    tracks.get(key).push([Math.round(e.ts * 1000), Math.round((e.ts + e.dur) * 1000)]);
  }
  for (const [key, slices] of tracks) {
    slices.sort((a, b) => a[0] - b[0] || b[1] - a[1]);
    const open = [];
    for (const [s, t] of slices) {
      while (open.length && open[open.length - 1] <= s) open.pop();
      assert.ok(!open.length || t <= open[open.length - 1],
                `slice [${s}, ${t}] ns overlaps without nesting on track ${key}`);
      open.push(t);
    }
  }
  return doc;
}

test('quickstart trace imports with the expected slices, flows and counters', () => {
  const trace = simulate('configs/quickstart.yaml', 'quickstart');
  const doc = assertStrictNesting(trace);
  const tp = loadTrace(trace);
  const s = summarize(tp);
  assert.deepEqual(s.import_errors, []);
  // 4 transfers, corner's split over its two minimal routes; each part has one slice per hop
  // plus one receive slice: lone 1+1, shared-a 2+1, shared-b 1+1, corner 2 x (6+1).
  assert.equal(s.slices, 21);
  // One flow arrow per transfer part, from its first hop to its receive slice.
  assert.equal(s.flows, 5);
  // One utilization counter per link direction used: 0->1, 4->5, 5->6 and the twelve hops of
  // corner's two routes (0-4-8-12-13-14-15 and 0-1-2-3-7-11-15: no link in common), one of
  // which, 0->1, lone uses too.
  assert.equal(s.counter_tracks, 14);
  const counterEvents = doc.traceEvents.filter((e) => e.ph === 'C').length;
  assert.equal(s.counters, counterEvents);
  // One process per device of the 4x4 slice, named like JAX's profiler.
  assert.equal(s.processes, 16);
  assert.ok(s.process_names.includes('/device:TPU:0'));
  assert.ok(s.process_names.includes('/device:TPU:15'));
  // Flows join a send on the source device to a receive on the destination.
  const rows = tp.query(`
      SELECT src.name AS name, sp.name AS from_process, dp.name AS to_process
      FROM flow
      JOIN slice src ON flow.slice_out = src.id
      JOIN thread_track stt ON src.track_id = stt.id JOIN thread st USING (utid)
      JOIN process sp ON st.upid = sp.upid
      JOIN slice dst ON flow.slice_in = dst.id
      JOIN thread_track dtt ON dst.track_id = dtt.id JOIN thread dt ON dtt.utid = dt.utid
      JOIN process dp ON dt.upid = dp.upid
      ORDER BY name`);
  const byName = Object.fromEntries(rows.map((r) => [r.name, r]));
  for (const part of ['corner (path 1/2)', 'corner (path 2/2)']) {
    assert.equal(byName[part].from_process, '/device:TPU:0');
    assert.equal(byName[part].to_process, '/device:TPU:15');
  }
  // shared-a and shared-b are received by device 6 over link 5->6 at overlapping times, so the
  // receive track is split into two lanes that each nest strictly.
  assert.ok(s.thread_names.includes('ICI recv \u2190 TPU 5 (1,1)'));
  assert.ok(s.thread_names.includes('ICI recv \u2190 TPU 5 (1,1) #2'));
});

test('the same run writes a byte-identical trace', () => {
  const a = fs.readFileSync(simulate('configs/quickstart.yaml', 'again1'));
  const b = fs.readFileSync(simulate('configs/quickstart.yaml', 'again2'));
  assert.ok(a.equals(b));
});

test('bidirectional ppermute loop: compute overlaps transfers going both ways', () => {
  // fsdp_ppermute_bidirectional.yaml: allgather_matmul over dp = 4 (a line of the 4x2 torus:
  // TPU 0-2-4-6 and 1-3-5-7), tp = 2; 3 steps, each shifting a top half +1 and a bottom half
  // -1 on all 8 devices: 3 * 2 * 8 = 48 ppermute transfers.
  const trace = path.join(tmp, 'fsdp_bidirectional.json');
  execFileSync(binary, ['run', path.join(root, 'configs/examples/fsdp_ppermute_bidirectional.yaml'),
                        '--trace', trace, '--numerics', 'off'], { stdio: 'pipe' });
  assertStrictNesting(trace);
  const tp = loadTrace(trace);
  const s = summarize(tp);
  assert.deepEqual(s.import_errors, []);
  const threadOf = (alias) => `JOIN thread_track ${alias}_tt ON ${alias}.track_id = ${alias}_tt.id
      JOIN thread ${alias}_th ON ${alias}_tt.utid = ${alias}_th.utid`;

  // A "compute" thread on each of the 8 device processes, with the lowering's 15 timed local
  // ops: 2 matmuls and 1 add per step, plus 1 accumulating add per step after the first (the
  // halves are sliced off as fused views, which take no time and leave no slice).
  const compute = tp.query(`
      SELECT p.name AS process, COUNT(c.id) AS n FROM slice c ${threadOf('c')}
      JOIN process p ON c_th.upid = p.upid
      WHERE c_th.name = 'compute' GROUP BY p.upid ORDER BY p.name`);
  assert.equal(compute.length, 8);
  for (const row of compute) {
    assert.match(row.process, /^\/device:TPU:[0-7]$/);
    assert.equal(row.n, 15, `${row.process} compute slices`);
  }

  // Transfer slices sit on the sender's link tracks ("ICI → TPU b (x,y)"); both directions of
  // every dp link carry some, the tp links none.
  const links = tp.query(`
      SELECT p.name AS process, x_th.name AS thread, COUNT(x.id) AS n FROM slice x ${threadOf('x')}
      JOIN process p ON x_th.upid = p.upid
      WHERE x_th.name LIKE 'ICI → %' GROUP BY p.upid, x_th.name`);
  const directed = new Set();
  for (const row of links) {
    const from = row.process.match(/^\/device:TPU:(\d+)$/)[1];
    const to = row.thread.match(/^ICI → TPU (\d+) /)[1];
    assert.ok(row.n > 0);
    directed.add(`${from}->${to}`);
  }
  const dpLinks = [[0, 2], [2, 4], [4, 6], [1, 3], [3, 5], [5, 7]];
  const want = dpLinks.flatMap(([a, b]) => [`${a}->${b}`, `${b}->${a}`]);
  assert.deepEqual([...directed].sort(), want.sort());

  // The loop overlaps: compute slices run while transfers leave the same device.
  const overlaps = tp.query(`
      SELECT p.name AS process, COUNT(DISTINCT c.id) AS n FROM slice c ${threadOf('c')}
      JOIN slice x ${threadOf('x')}
      JOIN process p ON c_th.upid = p.upid
      WHERE c_th.name = 'compute' AND x_th.name LIKE 'ICI → %' AND c_th.upid = x_th.upid
        AND c.ts < x.ts + x.dur AND x.ts < c.ts + c.dur
      GROUP BY p.upid`);
  assert.ok(overlaps.length >= 1, 'no compute slice overlaps a transfer');
  assert.equal(overlaps.length, 8, 'every device overlaps compute with its sends');

  // One flow per ppermute transfer, from the first hop's slice to the receive slice, and as
  // many receive slices.
  assert.equal(s.flows, 48);
  const recv = tp.query(`SELECT COUNT(r.id) AS n FROM slice r ${threadOf('r')}
      WHERE r_th.name LIKE 'ICI recv ← %'`);
  assert.equal(recv[0].n, 48);
  const flowEnds = tp.query(`
      SELECT COUNT(*) AS n FROM flow
      JOIN slice o ON flow.slice_out = o.id ${threadOf('o')}
      JOIN slice i ON flow.slice_in = i.id ${threadOf('i')}
      WHERE o_th.name LIKE 'ICI → %' AND i_th.name LIKE 'ICI recv ← %' AND o.name = i.name`);
  assert.equal(flowEnds[0].n, 48);
});

// Perfetto nests a slice inside every slice still open on its track when it starts (at
// equal timestamps, in file order); a child that ends after its parent means the writer put
// a longer slice after a shorter one that starts with it, or overlapping slices on one lane.
function childrenBeyondParent(tp) {
  const [row] = tp.query(`
      SELECT COUNT(*) AS n FROM slice child JOIN slice parent ON child.parent_id = parent.id
      WHERE child.ts + child.dur > parent.ts + parent.dur`);
  return row.n;
}

for (const config of ['configs/collectives_tour.yaml', 'configs/examples/mlp_fsdp_tp.yaml']) {
  test(`${config}: no child slice extends beyond its parent`, () => {
    const trace = path.join(tmp, `${path.basename(config, '.yaml')}_nesting.json`);
    execFileSync(binary, ['run', path.join(root, config), '--trace', trace, '--numerics', 'off'],
                 { stdio: 'pipe' });
    const tp = loadTrace(trace);
    assert.deepEqual(summarize(tp).import_errors, []);
    const [{ n: nested }] = tp.query(
        'SELECT COUNT(*) AS n FROM slice WHERE parent_id IS NOT NULL');
    assert.ok(nested > 0, 'the check needs nested slices to mean something');
    assert.equal(childrenBeyondParent(tp), 0);
  });
}

test('--trace-devices keeps only the chosen devices, and flows between them', () => {
  const trace = path.join(tmp, 'quickstart_devices.json');
  execFileSync(binary, ['run', path.join(root, 'configs/quickstart.yaml'), '--trace', trace,
                        '--trace-devices', '0-1,5-6'], { stdio: 'pipe' });
  const tp = loadTrace(trace);
  const s = summarize(tp);
  assert.deepEqual(s.import_errors, []);
  assert.deepEqual([...s.process_names].sort(),
                   ['/device:TPU:0', '/device:TPU:1', '/device:TPU:5', '/device:TPU:6']);
  assert.equal(childrenBeyondParent(tp), 0);
});

test('a pipeline traces its composed schedule: stages, tasks, sends and their flows', () => {
  // GPT-3 175B on 8 stages x 96 microbatches (1F1B): per stage 2 x 96 tasks, a send after
  // every task that feeds a neighbour (96 x 7 boundaries x 2 directions in all), each a flow
  // to the task that takes it, then each stage's gradient all-reduce and update.
  const trace = simulate('configs/models/gpt3_175b_a100_pp.yaml', 'pipeline');
  assertStrictNesting(trace);
  const tp = loadTrace(trace);
  const s = summarize(tp);
  assert.deepEqual(s.import_errors, []);
  assert.equal(s.processes, 8);
  assert.ok(s.process_names.includes('stage 0 (12 layers)'));
  const sends = 96 * 7 * 2;
  assert.equal(s.flows, sends);
  assert.equal(s.slices, 8 * 2 * 96 + sends + 8 * 2);
  // Every flow leaves a send and enters a task of the neighbouring stage, which starts after
  // the send ends.
  const bad = tp.query(`
      SELECT COUNT(*) AS n FROM flow
      JOIN slice src ON flow.slice_out = src.id
      JOIN slice dst ON flow.slice_in = dst.id
      WHERE src.name NOT LIKE 'send %' OR dst.ts < src.ts + src.dur
         OR (dst.name NOT LIKE 'forward %' AND dst.name NOT LIKE 'backward %')`);
  assert.equal(bad[0].n, 0);
});
