// Protobuf binary codec driven by the schema the server derives from its own
// descriptor set (GET /schema.json, see server/src/ui/schema.rs): the page
// never carries a copy of the .proto files that could fall out of step.
//
// Decoded messages are plain objects keyed by the proto field names
// (snake_case). Scalars absent on the wire get their proto3 defaults,
// repeated fields an array, map fields an object; message fields stay
// undefined when absent. Enums decode to their value names
// ("ITEM_STATE_CREATED"). 64-bit integers decode to Numbers when exact,
// otherwise to decimal strings. Well-known types become JavaScript values:
// Struct/Value/ListValue -> JSON values, Timestamp -> Date, Duration ->
// seconds (Number).

let schema = null;

/** Loads the schema from the server once; every call shares the result. */
let loading = null;
export function loadSchema(url = '/schema.json') {
  if (!loading) {
    loading = fetch(url, { credentials: 'omit', cache: 'no-cache' })
      .then((response) => {
        if (!response.ok) throw new Error(`cannot load ${url}: HTTP ${response.status}`);
        return response.json();
      })
      .then((json) => { setSchema(json); return json; });
  }
  return loading;
}

/** Installs a schema object (for tests, or a schema fetched elsewhere). */
export function setSchema(json) {
  schema = json;
}

function messageSchema(typeName) {
  if (!schema) throw new Error('protobuf schema not loaded');
  const message = schema.messages[typeName];
  if (!message) throw new Error(`unknown message type ${typeName}`);
  return message;
}

const TWO_32 = 4294967296;
const utf8Decoder = new TextDecoder('utf-8', { fatal: false });
const utf8Encoder = new TextEncoder();

class Reader {
  constructor(bytes) {
    this.bytes = bytes;
    this.pos = 0;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  done() {
    return this.pos >= this.bytes.length;
  }

  // Varint as a BigInt (exact for every 64-bit value).
  varintBig() {
    let result = 0n;
    let shift = 0n;
    for (;;) {
      if (this.pos >= this.bytes.length) throw new Error('truncated varint');
      const byte = this.bytes[this.pos++];
      result |= BigInt(byte & 0x7f) << shift;
      if ((byte & 0x80) === 0) return result;
      shift += 7n;
      if (shift > 63n) throw new Error('varint too long');
    }
  }

  // Varint as a Number when it fits in 7 bytes (49 bits, always exact),
  // otherwise as a BigInt.
  varint() {
    let result = 0;
    let multiplier = 1;
    const start = this.pos;
    for (let i = 0; i < 7; i++) {
      if (this.pos >= this.bytes.length) throw new Error('truncated varint');
      const byte = this.bytes[this.pos++];
      result += (byte & 0x7f) * multiplier;
      if ((byte & 0x80) === 0) return result;
      multiplier *= 128;
    }
    this.pos = start;
    return this.varintBig();
  }

  fixed32() {
    const value = this.view.getUint32(this.pos, true);
    this.pos += 4;
    return value;
  }

  fixed64Big() {
    const value = this.view.getBigUint64(this.pos, true);
    this.pos += 8;
    return value;
  }

  bytesField() {
    const length = Number(this.varint());
    if (this.pos + length > this.bytes.length) throw new Error('truncated length-delimited field');
    const slice = this.bytes.subarray(this.pos, this.pos + length);
    this.pos += length;
    return slice;
  }

  skip(wireType) {
    switch (wireType) {
      case 0: this.varint(); break;
      case 1: this.pos += 8; break;
      case 2: this.bytesField(); break;
      case 5: this.pos += 4; break;
      default: throw new Error(`unsupported wire type ${wireType}`);
    }
  }
}

// A 64-bit value as a Number when exact, else as a decimal string.
function exactNumber(big) {
  if (big <= BigInt(Number.MAX_SAFE_INTEGER) && big >= BigInt(Number.MIN_SAFE_INTEGER)) {
    return Number(big);
  }
  return big.toString();
}

function asBig(value) {
  return typeof value === 'bigint' ? value : BigInt(value);
}

function scalar(reader, kind, wireType) {
  switch (kind) {
    case 'string': return utf8Decoder.decode(reader.bytesField());
    case 'bytes': return reader.bytesField().slice();
    case 'bool': return Number(reader.varint()) !== 0;
    case 'uint32': return Number(asBig(reader.varint()) & 0xffffffffn);
    case 'int32': case 'enum': return Number(BigInt.asIntN(32, asBig(reader.varint())));
    case 'uint64': return exactNumber(BigInt.asUintN(64, asBig(reader.varint())));
    case 'int64': return exactNumber(BigInt.asIntN(64, asBig(reader.varint())));
    case 'sint32': case 'sint64': {
      const raw = asBig(reader.varint());
      return exactNumber((raw >> 1n) ^ -(raw & 1n));
    }
    case 'fixed32': return reader.fixed32();
    case 'sfixed32': return reader.fixed32() | 0;
    case 'fixed64': return exactNumber(reader.fixed64Big());
    case 'sfixed64': return exactNumber(BigInt.asIntN(64, reader.fixed64Big()));
    case 'float': { const v = reader.view.getFloat32(reader.pos, true); reader.pos += 4; return v; }
    case 'double': { const v = reader.view.getFloat64(reader.pos, true); reader.pos += 8; return v; }
    default: throw new Error(`unsupported field type ${kind} (wire type ${wireType})`);
  }
}

function defaultOf(kind, typeName) {
  switch (kind) {
    case 'string': return '';
    case 'bytes': return new Uint8Array(0);
    case 'bool': return false;
    case 'enum': return enumName(typeName, 0);
    case 'message': return undefined;
    default: return 0;
  }
}

function enumName(typeName, number) {
  const values = schema.enums[typeName];
  return (values && values[String(number)]) || number;
}

const PACKABLE = new Set(['bool', 'uint32', 'int32', 'enum', 'uint64', 'int64', 'sint32', 'sint64',
  'fixed32', 'sfixed32', 'fixed64', 'sfixed64', 'float', 'double']);

/** Decodes `bytes` (a Uint8Array) as message `typeName`, e.g. "reconciled.v1.Tenant". */
export function decode(typeName, bytes) {
  const message = messageSchema(typeName);
  const out = {};
  for (const [name, kind, repeated, fieldType] of Object.values(message.fields)) {
    if (repeated) {
      const entry = kind === 'message' ? schema.messages[fieldType] : null;
      out[name] = entry && entry.map ? {} : [];
    } else {
      out[name] = defaultOf(kind, fieldType);
    }
  }
  const reader = new Reader(bytes);
  while (!reader.done()) {
    const tag = Number(reader.varint());
    const number = Math.floor(tag / 8);
    const wireType = tag & 7;
    const field = message.fields[String(number)];
    if (!field) { reader.skip(wireType); continue; }
    const [name, kind, repeated, fieldType] = field;
    if (kind === 'message') {
      const body = reader.bytesField();
      const value = fieldType === 'google.protobuf.Value' ? decodeValue(body) : decode(fieldType, body);
      if (repeated) {
        const entry = schema.messages[fieldType];
        // An own property even for keys such as "__proto__" (a Struct's
        // keys are user data): plain assignment would set the prototype
        // and hide the entry.
        if (entry.map) {
          Object.defineProperty(out[name], String(value[entry.fields['1'][0]]), {
            value: value[entry.fields['2'][0]], enumerable: true, writable: true, configurable: true,
          });
        } else {
          out[name].push(value);
        }
      } else {
        out[name] = value;
      }
      continue;
    }
    if (repeated && wireType === 2 && PACKABLE.has(kind)) {
      const packed = new Reader(reader.bytesField());
      while (!packed.done()) out[name].push(convertEnum(kind, fieldType, scalar(packed, kind, wireType)));
      continue;
    }
    const value = convertEnum(kind, fieldType, scalar(reader, kind, wireType));
    if (repeated) out[name].push(value); else out[name] = value;
  }
  const convert = WELL_KNOWN[typeName];
  return convert ? convert(out) : out;
}

function convertEnum(kind, typeName, value) {
  return kind === 'enum' ? enumName(typeName, value) : value;
}

function numberOf(value) {
  return typeof value === 'string' ? Number(value) : value;
}

const WELL_KNOWN = {
  'google.protobuf.Struct': (struct) => struct.fields,
  'google.protobuf.ListValue': (list) => list.values,
  'google.protobuf.Timestamp': (ts) => new Date(numberOf(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6)),
  'google.protobuf.Duration': (d) => numberOf(d.seconds) + d.nanos / 1e9,
};

// google.protobuf.Value is a oneof whose members may hold their defaults
// ("", false, 0): decode it by hand to keep the member that was sent.
function decodeValue(bytes) {
  const reader = new Reader(bytes);
  let result = null;
  while (!reader.done()) {
    const tag = Number(reader.varint());
    const number = Math.floor(tag / 8);
    const wireType = tag & 7;
    switch (number) {
      case 1: reader.varint(); result = null; break;
      case 2: result = scalar(reader, 'double', wireType); break;
      case 3: result = scalar(reader, 'string', wireType); break;
      case 4: result = scalar(reader, 'bool', wireType); break;
      case 5: result = decode('google.protobuf.Struct', reader.bytesField()); break;
      case 6: result = decode('google.protobuf.ListValue', reader.bytesField()); break;
      default: reader.skip(wireType);
    }
  }
  return result;
}

class Writer {
  constructor() {
    this.chunks = [];
    this.length = 0;
  }

  push(bytes) {
    this.chunks.push(bytes);
    this.length += bytes.length;
  }

  varint(value) {
    let big = BigInt.asUintN(64, BigInt(value));
    const out = [];
    while (big >= 0x80n) {
      out.push(Number(big & 0x7fn) | 0x80);
      big >>= 7n;
    }
    out.push(Number(big));
    this.push(Uint8Array.from(out));
  }

  tag(number, wireType) {
    this.varint(number * 8 + wireType);
  }

  finish() {
    const out = new Uint8Array(this.length);
    let offset = 0;
    for (const chunk of this.chunks) { out.set(chunk, offset); offset += chunk.length; }
    return out;
  }
}

function enumNumber(typeName, value) {
  if (typeof value === 'number') return value;
  const values = schema.enums[typeName] || {};
  for (const [number, name] of Object.entries(values)) if (name === value) return Number(number);
  throw new Error(`unknown value ${value} of enum ${typeName}`);
}

function writeScalar(writer, number, kind, typeName, value) {
  switch (kind) {
    case 'string': {
      const bytes = utf8Encoder.encode(value);
      writer.tag(number, 2); writer.varint(bytes.length); writer.push(bytes); return;
    }
    case 'bytes': writer.tag(number, 2); writer.varint(value.length); writer.push(value); return;
    case 'bool': writer.tag(number, 0); writer.varint(value ? 1 : 0); return;
    case 'enum': writer.tag(number, 0); writer.varint(enumNumber(typeName, value)); return;
    case 'uint32': case 'int32': case 'uint64': case 'int64':
      writer.tag(number, 0); writer.varint(value); return;
    case 'double': {
      const bytes = new Uint8Array(8);
      new DataView(bytes.buffer).setFloat64(0, value, true);
      writer.tag(number, 1); writer.push(bytes); return;
    }
    default: throw new Error(`encoding ${kind} is not supported`);
  }
}

function isDefault(kind, value) {
  return value === undefined || value === null || value === '' || value === 0 || value === false
    || (kind === 'enum' && typeof value === 'string' && value.endsWith('_UNSPECIFIED'));
}

/** Encodes `object` as message `typeName`; unknown keys are an error. */
export function encode(typeName, object) {
  const message = messageSchema(typeName);
  const byName = {};
  for (const [number, field] of Object.entries(message.fields)) byName[field[0]] = [Number(number), ...field];
  const writer = new Writer();
  for (const [key, value] of Object.entries(object || {})) {
    const field = byName[key];
    if (!field) throw new Error(`${typeName} has no field ${key}`);
    const [number, , kind, repeated, fieldType] = field;
    const values = repeated ? value : [value];
    for (const one of values) {
      if (kind === 'message') {
        if (one === undefined || one === null) continue;
        const bytes = encode(fieldType, one);
        writer.tag(number, 2); writer.varint(bytes.length); writer.push(bytes);
      } else if (repeated || !isDefault(kind, one)) {
        writeScalar(writer, number, kind, fieldType, one);
      }
    }
  }
  return writer.finish();
}
