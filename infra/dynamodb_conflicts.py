"""DynamoDB's transaction conflicts, in front of DynamoDB Local.

DynamoDB Local runs every write of a table under one table lock, so its transactions never
overlap and never conflict. DynamoDB does not queue them: a write to an item that an ongoing
transaction holds is refused. Code that is only ever tested on DynamoDB Local therefore never
meets TransactionConflict, and a hot item written inside transactions (a counter every request
updates) works in tests and fails under load in production.

This proxy forwards every request to DynamoDB Local unchanged and answers for DynamoDB what it
does when writes overlap in time (its rules for TransactWriteItems conflicts):

- a TransactWriteItems any of whose items (ConditionCheck included) is part of another
  TransactWriteItems still in flight is cancelled: TransactionCanceledException, reason
  TransactionConflict for each such item and None for the others; nothing of it is applied;
- a PutItem, UpdateItem or DeleteItem of an item that a TransactWriteItems in flight holds
  fails with TransactionConflictException; single-item writes do not conflict with each other
  (DynamoDB serializes them), nor with a transaction that arrives while they are in flight;
- reads, and everything else, pass through.

A transaction holds its items from the moment it arrives until DynamoDB Local has answered it, but
for at most 50 ms: a DynamoDB transaction holds its items for the tens of milliseconds it takes,
while DynamoDB Local's answer also waits for its table lock behind every other write of the
emulator (under a test suite's load, for seconds), which DynamoDB has no counterpart of.
Transactions that arrive within that window of each other on one item conflict, as they would on
DynamoDB; later ones are still serialized by DynamoDB Local's lock. A request refused here never reaches
DynamoDB Local, as a cancelled transaction writes nothing.

At most four writes of a table are at DynamoDB Local at once; the others wait here. DynamoDB
Local gives up on a write that waited too long for its table lock with an InternalServerError
("This request will succeed in actual DynamoDB API"): a hundred concurrent orders of one SKU
met it. Waiting here instead changes no answer, only when it comes.

DynamoDB Streams go straight to DynamoDB Local (they are not proxied).

usage: python3 dynamodb_conflicts.py LISTEN_PORT UPSTREAM_PORT
"""

import http.client
import http.server
import json
import sys
import threading
import time
import zlib

_TARGET_PREFIX = "DynamoDB_20120810."
_SINGLE_WRITES = {"PutItem", "UpdateItem", "DeleteItem"}

# The longest an item is held for one request (see the module's doc).
HOLD_S = 0.05
# Writes of one table in flight at DynamoDB Local at once (see the module's doc).
WRITERS_PER_TABLE = 4


class Holds:
    """Items held by transactions in flight: (table, key) -> {request: held until}."""

    def __init__(self, window):
        self._lock = threading.Lock()
        self._held = {}
        self._window = window
        self._next = 0

    def _held_now(self, item, now):
        return any(until > now for until in self._held.get(item, {}).values())

    def take_transaction(self, items):
        """Holds every item, or none: (the request, []) or (None, the indexes of the items
        another transaction holds)."""
        with self._lock:
            now = time.monotonic()
            conflicts = [i for i, item in enumerate(items) if self._held_now(item, now)]
            if conflicts:
                return None, conflicts
            self._next += 1
            for item in items:
                self._held.setdefault(item, {})[self._next] = now + self._window
            return self._next, []

    def single_may_write(self, item):
        """Whether a single write of the item may go (no transaction holds it)."""
        with self._lock:
            return not self._held_now(item, time.monotonic())

    def release(self, request, items):
        with self._lock:
            for item in items:
                entries = self._held.get(item)
                if entries is None:
                    continue
                entries.pop(request, None)
                if not entries:
                    del self._held[item]


class Writers:
    """A semaphore per table bounding its writes in flight at DynamoDB Local."""

    def __init__(self, per_table):
        self._lock = threading.Lock()
        self._per_table = per_table
        self._gates = {}

    def of(self, table):
        with self._lock:
            gate = self._gates.get(table)
            if gate is None:
                gate = self._gates[table] = threading.BoundedSemaphore(self._per_table)
            return gate


class KeySchemas:
    """The key attribute names of each table, asked of DynamoDB Local once."""

    def __init__(self, upstream_port):
        self._port = upstream_port
        self._lock = threading.Lock()
        self._names = {}

    def names(self, table, headers):
        with self._lock:
            if table in self._names:
                return self._names[table]
        conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=30)
        try:
            forwarded = {k: v for k, v in headers.items() if k.lower() in {"authorization", "x-amz-date", "host"}}
            forwarded["X-Amz-Target"] = _TARGET_PREFIX + "DescribeTable"
            forwarded["Content-Type"] = "application/x-amz-json-1.0"
            conn.request("POST", "/", json.dumps({"TableName": table}), forwarded)
            answer = json.loads(conn.getresponse().read() or b"{}")
        finally:
            conn.close()
        schema = answer.get("Table", {}).get("KeySchema")
        if not schema:
            return None
        names = tuple(sorted(k["AttributeName"] for k in schema))
        with self._lock:
            self._names[table] = names
        return names


def _item_id(table, key):
    return (table, json.dumps(key, sort_keys=True))


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    holds = None
    writers = None
    schemas = None
    upstream_port = None

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._forward(b"")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        operation = (self.headers.get("X-Amz-Target") or "").removeprefix(_TARGET_PREFIX)
        try:
            request = json.loads(body) if operation in _SINGLE_WRITES or operation == "TransactWriteItems" else None
        except ValueError:
            request = None
        if operation == "TransactWriteItems" and request is not None:
            items = self._transaction_items(request)
            if items is not None:
                held, conflicts = self.holds.take_transaction(items)
                if held is None:
                    return self._transaction_conflict(len(items), conflicts)
                try:
                    return self._forward_write(body, {table for table, _ in items})
                finally:
                    self.holds.release(held, items)
        if operation in _SINGLE_WRITES and request is not None:
            item = self._single_item(operation, request)
            if item is not None:
                if not self.holds.single_may_write(item):
                    return self._error(
                        "TransactionConflictException", "Transaction is ongoing for the item", lower_message=True
                    )
                return self._forward_write(body, {item[0]})
        self._forward(body)

    def _forward_write(self, body, tables):
        """Forwards a write with at most WRITERS_PER_TABLE writes of each of its tables at
        DynamoDB Local at once: the rest wait here, not on its table lock (whose timeout it
        answers as an InternalServerError that DynamoDB would not give)."""
        gates = [self.writers.of(table) for table in sorted(tables)]
        for gate in gates:
            gate.acquire()
        try:
            return self._forward(body)
        finally:
            for gate in reversed(gates):
                gate.release()

    def _key_of(self, table, item):
        names = self.schemas.names(table, self.headers)
        if names is None or any(n not in item for n in names):
            return None
        return {n: item[n] for n in names}

    def _transaction_items(self, request):
        items = []
        for entry in request.get("TransactItems", []):
            if len(entry) != 1:
                return None
            op, body = next(iter(entry.items()))
            table = body.get("TableName")
            key = self._key_of(table, body["Item"]) if op == "Put" and "Item" in body else body.get("Key")
            if table is None or key is None:
                return None
            items.append(_item_id(table, key))
        # Two writes of one item are DynamoDB Local's to refuse (ValidationException).
        return items if len(set(items)) == len(items) else None

    def _single_item(self, operation, request):
        table = request.get("TableName")
        if table is None:
            return None
        key = self._key_of(table, request.get("Item", {})) if operation == "PutItem" else request.get("Key")
        return None if key is None else _item_id(table, key)

    def _transaction_conflict(self, count, conflicts):
        reasons = [
            {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
            if i in conflicts
            else {"Code": "None"}
            for i in range(count)
        ]
        codes = ", ".join(r["Code"] for r in reasons)
        self._error(
            "TransactionCanceledException",
            f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]",
            CancellationReasons=reasons,
        )

    def _error(self, kind, message, lower_message=False, **extra):
        body = {"__type": f"com.amazonaws.dynamodb.v20120810#{kind}", "message" if lower_message else "Message": message}
        body.update(extra)
        data = json.dumps(body).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amz-crc32", str(zlib.crc32(data)))
        self.send_header("x-amzn-RequestId", "conflict-" + threading.current_thread().name)
        self.end_headers()
        self.wfile.write(data)

    def finish(self):
        super().finish()
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()

    def _upstream(self):
        conn = getattr(self, "_conn", None)
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=120)
            self._conn = conn
        return conn

    def _forward(self, body):
        headers = {k: v for k, v in self.headers.items() if k.lower() not in {"content-length", "connection"}}
        for attempt in range(2):
            conn = self._upstream()
            try:
                conn.request(self.command, self.path, body, headers)
                answer = conn.getresponse()
                data = answer.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self._conn = None
                if attempt == 1:
                    raise
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in {"content-length", "transfer-encoding", "connection", "server", "date"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    listen, upstream = int(argv[1]), int(argv[2])
    Proxy.holds = Holds(HOLD_S)
    Proxy.writers = Writers(WRITERS_PER_TABLE)
    Proxy.schemas = KeySchemas(upstream)
    Proxy.upstream_port = upstream
    server = Server(("127.0.0.1", listen), Proxy)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
