// gRPC-Web over fetch: unary calls and server streams to the dashboard's own
// origin, the bearer token in the `authorization` header, the status from
// the trailers (or from the headers of a trailers-only answer). A failed
// call throws a GrpcError carrying the server's grpc-message, which the
// page shows as it is.

import { decode, encode } from './proto.js';

/** gRPC status code names, by number. */
export const CODE_NAMES = ['OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED',
  'NOT_FOUND', 'ALREADY_EXISTS', 'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION',
  'ABORTED', 'OUT_OF_RANGE', 'UNIMPLEMENTED', 'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS',
  'UNAUTHENTICATED'];

/** A call that ended with a non-OK status. */
export class GrpcError extends Error {
  constructor(code, message, details) {
    super(message || CODE_NAMES[code] || `status ${code}`);
    this.code = code;
    this.codeName = CODE_NAMES[code] || String(code);
    this.details = details || null;
  }
}

/**
 * The google.rpc.ErrorInfo among a failed call's details (`{reason,
 * domain, metadata}`, metadata an object of strings), or null when it has
 * none or its details cannot be read.
 */
export function errorInfo(error) {
  if (!error || !error.details) return null;
  try {
    // grpc-status-details-bin: base64, padding optional.
    const text = error.details.replace(/-/g, '+').replace(/_/g, '/');
    const padded = text + '='.repeat((4 - (text.length % 4)) % 4);
    const bytes = Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
    const status = decode('google.rpc.Status', bytes);
    for (const any of status.details || []) {
      if (String(any.type_url).endsWith('/google.rpc.ErrorInfo')) {
        return decode('google.rpc.ErrorInfo', any.value);
      }
    }
  } catch {
    // Unreadable details are no details.
  }
  return null;
}

function grpcMessage(raw) {
  if (!raw) return '';
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

function frame(message) {
  const out = new Uint8Array(5 + message.length);
  const view = new DataView(out.buffer);
  out[0] = 0;
  view.setUint32(1, message.length, false);
  out.set(message, 5);
  return out;
}

function parseTrailers(bytes) {
  const text = new TextDecoder().decode(bytes);
  const trailers = {};
  for (const line of text.split('\r\n')) {
    const colon = line.indexOf(':');
    if (colon > 0) trailers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  return trailers;
}

function statusError(code, message, details) {
  return new GrpcError(Number(code), grpcMessage(message), details);
}

/**
 * Calls `path` (e.g. "/reconciled.v1.Tenants/WatchFleet") with `request`
 * encoded as `requestType`, and yields every response message decoded as
 * `responseType`. Ends when the server's status is OK; throws GrpcError
 * otherwise. `signal` (an AbortSignal) cancels the call.
 */
export async function* call(path, requestType, responseType, request, { token, signal } = {}) {
  const headers = {
    'content-type': 'application/grpc-web+proto',
    'accept': 'application/grpc-web+proto',
    'x-grpc-web': '1',
  };
  if (token) headers.authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(path, {
      method: 'POST',
      headers,
      body: frame(encode(requestType, request)),
      signal,
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch (error) {
    if (signal && signal.aborted) throw error;
    throw new GrpcError(14, `cannot reach the server: ${error.message}`);
  }
  const headerStatus = response.headers.get('grpc-status');
  if (headerStatus !== null && headerStatus !== '0') {
    throw statusError(headerStatus, response.headers.get('grpc-message'),
      response.headers.get('grpc-status-details-bin'));
  }
  if (!response.ok) {
    throw new GrpcError(response.status === 401 ? 16 : 14,
      `the server answered HTTP ${response.status} ${response.statusText}`);
  }
  const reader = response.body.getReader();
  let buffer = new Uint8Array(0);
  let trailers = headerStatus === '0' ? { 'grpc-status': '0' } : null;
  for (;;) {
    const { value, done } = await reader.read();
    if (value && value.length) {
      const joined = new Uint8Array(buffer.length + value.length);
      joined.set(buffer, 0);
      joined.set(value, buffer.length);
      buffer = joined;
    }
    let offset = 0;
    while (buffer.length - offset >= 5) {
      const flags = buffer[offset];
      const length = new DataView(buffer.buffer, buffer.byteOffset + offset + 1, 4).getUint32(0, false);
      if (buffer.length - offset - 5 < length) break;
      const payload = buffer.subarray(offset + 5, offset + 5 + length);
      offset += 5 + length;
      if (flags & 0x80) {
        trailers = parseTrailers(payload);
      } else {
        // Copy: the buffer is replaced as more bytes arrive.
        yield decode(responseType, payload.slice());
      }
    }
    buffer = buffer.slice(offset);
    if (done) break;
  }
  if (!trailers || trailers['grpc-status'] === undefined) {
    throw new GrpcError(14, 'the connection ended before the server sent a status');
  }
  if (trailers['grpc-status'] !== '0') {
    throw statusError(trailers['grpc-status'], trailers['grpc-message'],
      trailers['grpc-status-details-bin']);
  }
}

/** A unary call: the single response message. */
export async function unary(path, requestType, responseType, request, options) {
  let result;
  for await (const message of call(path, requestType, responseType, request, options)) {
    result = message;
  }
  if (result === undefined) throw new GrpcError(13, 'the server sent no response message');
  return result;
}
