// Loads traces that shardsim writes into Perfetto's real trace processor (v20.1, WebAssembly)
// and checks what it imported with SQL, plus what the importer does not check (strictly
// nested slices per track, complete JSON, byte-identical reruns).
// Run: SHARDSIM_BINARY=build/shardsim node --test tests/trace/trace_test.mjs
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import test from 'node:test';
import { fileURLToPath } from 'node:url';

import { loadTrace, summarize } from './perfetto_check.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..', '..');
const binary = process.env.SHARDSIM_BINARY || path.join(root, 'build', 'shardsim');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'shardsim-trace-'));

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
  // 4 transfers; each has one slice per hop plus one receive slice:
  // lone 1+1, shared-a 2+1, shared-b 1+1, corner 6+1.
  assert.equal(s.slices, 14);
  // One flow arrow per transfer, from its first hop to its receive slice.
  assert.equal(s.flows, 4);
  // One utilization counter per link direction used: 0->1, 4->5, 5->6 and corner's six hops.
  assert.equal(s.counter_tracks, 9);
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
  assert.equal(byName.corner.from_process, '/device:TPU:0');
  assert.equal(byName.corner.to_process, '/device:TPU:15');
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
