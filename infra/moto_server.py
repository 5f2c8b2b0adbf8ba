"""moto's server, with DynamoDB operations serialized.

moto implements TransactWriteItems by deep-copying the whole table first and restoring that
copy when a condition fails. Under concurrent requests (its server is threaded) a failed
transaction therefore rolls back *other* clients' writes made meanwhile, stream records
included: committed work silently disappears, which real DynamoDB never does. Tidings' tests
run failing conditional transactions concurrently on purpose (races for stock, for restock
notices), so this wrapper takes one lock around every DynamoDB and DynamoDB Streams backend
call. Other services (SQS long polls) stay concurrent.

The restore also replaces the table object, and with it the stream shard that open shard
iterators point to: after one failed transaction, a reader following its iterators would never
see another record. So an iterator re-resolves the table's current shard on every read.

usage: python moto_server.py -H 127.0.0.1 -p 5005   (same arguments as moto_server)
"""

import functools
import sys
import threading

from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodbstreams.models import DynamoDBStreamsBackend, ShardIterator

_LOCK = threading.RLock()


def _serialized(method):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with _LOCK:
            return method(*args, **kwargs)

    return wrapper


for cls in (DynamoDBBackend, DynamoDBStreamsBackend):
    for name, member in list(vars(cls).items()):
        if callable(member) and not name.startswith("_"):
            setattr(cls, name, _serialized(member))

_original_get = ShardIterator.get


def _get_from_current_shard(self, limit=1000):
    with _LOCK:
        table = self.streams_backend.dynamodb.tables.get(self.stream_shard.table.name)
        if table is not None and getattr(table, "stream_shard", None) is not None:
            self.stream_shard = table.stream_shard
        return _original_get(self, limit)


ShardIterator.get = _get_from_current_shard

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main(sys.argv[1:]))
