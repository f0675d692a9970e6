#!/usr/bin/env python3
"""A reconciled configurator agent in Python: only grpcio and stubs generated
from proto/ (see README.md). It manages items of type `pykv`, each a file
under --root:

  {"key": "motd", "value": "hi"}   the file <root>/motd holds "hi"
  "needs": "flag"                  answer WAIT (ask again in 1 s) until
                                   <root>/flag exists
  "await": "flag"                  long-running: answer IN_PROGRESS, send
                                   progress every 0.2 s until <root>/flag
                                   exists, then DONE

Changing `key` recreates the item (recreate_on_change ["/key"]). Results are
kept until the server acknowledges them and resent after a reconnect;
requests are de-duplicated on (op_id, attempt).
"""

import argparse
import os
import queue
import sys
import threading
import time

import grpc
from google.protobuf import json_format, struct_pb2
from google.rpc import error_details_pb2, status_pb2
from reconciled.v1 import configurators_pb2 as pb
from reconciled.v1 import configurators_pb2_grpc, model_pb2

PROTOCOL_VERSION = 1
CANCELLED, INVALID_ARGUMENT, UNIMPLEMENTED, UNAVAILABLE = 1, 3, 12, 14
POLL = 0.2  # seconds between progress reports while a file is awaited
WAIT_RETRY = 1  # seconds the server waits before asking again after WAIT
FINAL = (model_pb2.OUTCOME_DONE, model_pb2.OUTCOME_FAILED)


class Agent:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.unacked = {}  # (op_id, attempt) -> [OperationResult], until acked
        self.running = set()  # (op_id, attempt) being applied
        self.cancelled = set()  # op_ids the server cancelled
        self.outbox = None

    def send(self, **message):
        self.outbox.put(pb.AgentMessage(**message))

    def requests(self, outbox):
        with self.lock:  # what still runs here, or waits for its ack: the server waits for it
            outstanding = sorted({op_id for op_id, _ in self.running | self.unacked.keys()})
        yield pb.AgentMessage(register=pb.Register(
            tenant=self.args.tenant, agent_id=self.args.agent_id,
            protocol_version=PROTOCOL_VERSION,
            item_types=[pb.ItemTypeSpec(item_type="pykv", recreate_on_change=["/key"])],
            outstanding_op_ids=outstanding, lists_outstanding=True))
        while (message := outbox.get()) is not None:
            yield message

    def session(self, addr):
        """One Connect stream to addr (host:port), until it ends."""
        self.outbox = outbox = queue.Queue()
        channel = grpc.insecure_channel(addr)
        stub = configurators_pb2_grpc.ConfiguratorsStub(channel)
        metadata = [("authorization", f"Bearer {self.args.token}")]
        try:
            for message in stub.Connect(self.requests(outbox), metadata=metadata):
                kind = message.WhichOneof("message")
                if kind == "registered":
                    interval = message.registered.heartbeat_interval.ToTimedelta().total_seconds()
                    print(f"registered session {message.registered.session_id}", flush=True)
                    threading.Thread(target=self.heartbeats, args=(outbox, interval or 5), daemon=True).start()
                    with self.lock:  # resend what the last session did not see acknowledged
                        for results in self.unacked.values():
                            for result in results:
                                self.send(result=result)
                elif kind == "operation":
                    self.on_operation(message.operation)
                elif kind == "result_ack":
                    ack = (message.result_ack.op_id, message.result_ack.attempt)
                    with self.lock:  # acknowledgements come in the order results went out
                        if self.unacked.get(ack):
                            self.unacked[ack].pop(0)
                        if not self.unacked.get(ack):
                            self.unacked.pop(ack, None)
                elif kind == "cancel":
                    with self.lock:
                        self.cancelled.add(message.cancel.op_id)
                        idle = not any(op_id == message.cancel.op_id for op_id, _ in self.running)
                    if idle:  # otherwise acknowledged when the operation has stopped
                        self.send(cancel_ack=pb.CancelAck(op_id=message.cancel.op_id))
        finally:
            outbox.put(None)
            channel.close()

    def heartbeats(self, outbox, interval):
        while self.outbox is outbox:
            outbox.put(pb.AgentMessage(heartbeat=pb.Heartbeat()))
            time.sleep(interval)

    def on_operation(self, request):
        key = (request.op_id, request.attempt)
        with self.lock:
            if key in self.running:
                return  # a re-delivery of what runs now
            answered = [r for r in self.unacked.get(key, []) if r.outcome in FINAL]
            if answered:  # answered already: resend (a re-ask after WAIT runs again)
                self.send(result=answered[-1])
                return
            self.running.add(key)
        threading.Thread(target=self.apply, args=(request,), daemon=True).start()

    def finish(self, request, outcome, code=0, message="", retry_after=None, observed=None):
        result = pb.OperationResult(op_id=request.op_id, attempt=request.attempt, outcome=outcome)
        if code:
            result.status.CopyFrom(status_pb2.Status(code=code, message=message))
        if retry_after is not None:
            result.retry_after.FromMilliseconds(int(retry_after * 1000))
        if observed is not None:
            result.observed.CopyFrom(observed)
        with self.lock:
            self.unacked.setdefault((request.op_id, request.attempt), []).append(result)
            if outcome != model_pb2.OUTCOME_IN_PROGRESS:
                self.running.discard((request.op_id, request.attempt))
                if request.op_id in self.cancelled:
                    self.cancelled.discard(request.op_id)
                    self.send(result=result)
                    self.send(cancel_ack=pb.CancelAck(op_id=request.op_id))
                    return
        self.send(result=result)

    def apply(self, request):
        props = json_format.MessageToDict(request.item.properties)
        key = props.get("key")
        if not isinstance(key, str) or not key or "/" in key or key.startswith("."):
            return self.finish(request, model_pb2.OUTCOME_FAILED, INVALID_ARGUMENT,
                               f'item {request.item.name}: set "key" to a file name without "/"')
        path = os.path.join(self.args.root, key)
        kind = request.operation
        try:
            if kind == model_pb2.OPERATION_KIND_DELETE:
                if os.path.exists(path):
                    os.remove(path)
                return self.finish(request, model_pb2.OUTCOME_DONE)
            if kind not in (model_pb2.OPERATION_KIND_CREATE, model_pb2.OPERATION_KIND_MODIFY):
                return self.finish(request, model_pb2.OUTCOME_FAILED, UNIMPLEMENTED,
                                   "this agent answers only CREATE, MODIFY and DELETE")
            needs = props.get("needs")
            if needs and not os.path.exists(os.path.join(self.args.root, needs)):
                return self.finish(request, model_pb2.OUTCOME_WAIT, retry_after=WAIT_RETRY)
            awaited = props.get("await")
            if awaited and not os.path.exists(os.path.join(self.args.root, awaited)):
                self.finish(request, model_pb2.OUTCOME_IN_PROGRESS)
                while not os.path.exists(os.path.join(self.args.root, awaited)):
                    if request.op_id in self.cancelled:
                        return self.finish(request, model_pb2.OUTCOME_FAILED, CANCELLED, "cancelled as asked")
                    self.send(progress=pb.OperationProgress(
                        op_id=request.op_id, attempt=request.attempt, message=f"waiting for {awaited}"))
                    time.sleep(POLL)
            value = str(props.get("value", ""))
            with open(path + ".tmp", "w") as file:
                file.write(value)
            os.replace(path + ".tmp", path)
            observed = struct_pb2.Struct()
            observed.update({"key": key, "value": value})
            self.finish(request, model_pb2.OUTCOME_DONE, observed=observed)
        except OSError as error:
            self.finish(request, model_pb2.OUTCOME_FAILED, UNAVAILABLE, f"{path}: {error}")


def not_owner(error):
    """With replicas on etcd, a replica that does not serve the tenant refuses
    Connect with UNAVAILABLE and ErrorInfo NOT_OWNER naming the owner's
    address: that address ("" while no replica serves it), else None."""
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    for key, value in error.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        for detail in status_pb2.Status.FromString(value).details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info) and info.reason == "NOT_OWNER":
                return info.metadata.get("owner", "")
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:50051",
                        help="host:port of the server; several, comma-separated, for replicas")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--token", default=os.environ.get("RECONCILED_TOKEN"))
    parser.add_argument("--agent-id", default="pykv-1")
    parser.add_argument("--root", required=True, help="the folder the files go to")
    args = parser.parse_args()
    os.makedirs(args.root, exist_ok=True)
    agent, backoff = Agent(args), 0.1
    addrs, turn, redirect = args.addr.split(","), 0, None
    while True:
        addr, redirect = redirect or addrs[turn % len(addrs)], None
        try:
            agent.session(addr)
            backoff = 0.1
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT,
                                grpc.StatusCode.NOT_FOUND):
                sys.exit(f"refused: {error.code().name}: {error.details()}")
            owner = not_owner(error)
            if owner:  # another replica serves the tenant: go there at once
                print(f"redirected to {owner}", flush=True)
                redirect = owner
                continue
            if owner is None:  # this address failed: try the next one
                turn += 1
            print(f"disconnected: {error.code().name}: {error.details()}", flush=True)
        time.sleep(backoff)  # reconnect with exponential backoff
        backoff = min(backoff * 2, 5)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        # Ctrl-C: leave without a traceback. What still ran, and results not
        # yet acknowledged, go with the process: the server re-delivers those
        # operations to the agent's next session.
        print("stopped (Ctrl-C); the server re-delivers unfinished operations", flush=True)
        sys.exit(130)
