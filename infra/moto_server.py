"""moto's server, with DynamoDB operations serialized.

moto implements TransactWriteItems by deep-copying the whole table first and restoring that
copy when a condition fails. Under concurrent requests (its server is threaded) a failed
transaction therefore rolls back *other* clients' writes made meanwhile, stream records
included: committed work silently disappears, which real DynamoDB never does. Tidings' tests
run failing conditional transactions concurrently on purpose (races for stock, for restock
notices), so this wrapper takes one lock around every DynamoDB and DynamoDB Streams backend
call. Other services (SQS long polls) stay concurrent.

TransactWriteItems itself is replaced (`_transact_write_items` below): under the lock, the
conditions are checked first and the writes applied only when all hold, so nothing is copied
and nothing rolled back.

SQS is made linear (`_fast_sqs` below): moto reads the clock through two datetime conversions
for every message it looks at, recomputes every queue attribute (three passes over all
messages) on each SendMessage and, per message received, on the retention check, and twice
per name in GetQueueAttributes. With a few thousand messages queued, a campaign of 2,000 ran
at about 14 requests per second and starved every other test sharing the emulator. The
patched clock and one-pass counts change no behaviour, only the cost. Likewise a DynamoDB Query
on the table (not an index) reads its one partition (`_partition_query`) where moto sorted the
whole table on every call, and the per-request access log (a lock every thread waits on) is off
unless `MOTO_ACCESS_LOG=1`.

moto's restore also replaced the table object, and with it the stream shard that open shard
iterators point to: after one failed transaction, a reader following its iterators would never
see another record. So an iterator re-resolves the table's current shard on every read.

usage: python moto_server.py -H 127.0.0.1 -p 5005   (same arguments as moto_server)
"""

import functools
import logging
import os
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


def _transact_write_items(self, transact_items):
    """TransactWriteItems without moto's deep copy of the whole table for every item of the
    transaction (a 100-write transaction on a table of a few thousand items copied it a hundred
    times: minutes per campaign page, and gigabytes the garbage collector never caught up
    with). Calls are serialized (above), so every condition is checked first, on the current
    items, and the writes are applied only when all hold: nothing to roll back."""
    from moto.dynamodb.comparisons import get_filter_expression
    from moto.dynamodb.exceptions import (
        ConditionalCheckFailed,
        MultipleTransactionsException,
        TooManyTransactionsException,
        TransactionCanceledException,
        TransactWriteSingleOpException,
    )

    if len(transact_items) > 100:
        raise TooManyTransactionsException()
    seen = set()
    planned = []
    errors = []
    for item in transact_items:
        if len(list(item.keys())) > 1:
            raise TransactWriteSingleOpException
        op_type, op = next(iter(item.items()))
        if op_type not in {"ConditionCheck", "Put", "Delete", "Update"}:
            raise ValueError("Unsupported transaction operation")
        table_name = op["TableName"]
        if op_type == "Put":
            attrs = op["Item"]
            table = self.get_table(table_name)
            key = {table.hash_key_attr: attrs[table.hash_key_attr]}
            if table.range_key_attr is not None:
                key[table.range_key_attr] = attrs[table.range_key_attr]
        else:
            key = op["Key"]
        unique = (str(table_name), str(dict(sorted(key.items()))))
        if unique in seen:
            raise MultipleTransactionsException()
        seen.add(unique)
        condition = op.get("ConditionExpression")
        names = op.get("ExpressionAttributeNames")
        values = op.get("ExpressionAttributeValues")
        error = (None, None, None)
        if condition is not None:
            current = self.get_item(table_name, key)
            if not get_filter_expression(condition, names, values).expr(current):
                old = None
                if op.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and current:
                    old = current.to_json()["Attributes"]
                error = ("ConditionalCheckFailed", str(ConditionalCheckFailed().message), old)
        errors.append(error)
        planned.append((op_type, op, table_name, key, names, values))
    if any(code is not None for code, _, _ in errors):
        raise TransactionCanceledException(errors)
    for op_type, op, table_name, key, names, values in planned:
        if op_type == "Put":
            self.put_item(table_name, op["Item"], expression_attribute_names=names, expression_attribute_values=values)
        elif op_type == "Delete":
            self.delete_item(table_name, key, expression_attribute_names=names, expression_attribute_values=values)
        elif op_type == "Update":
            self.update_item(
                table_name,
                key,
                update_expression=op["UpdateExpression"],
                expression_attribute_names=names,
                expression_attribute_values=values,
            )


DynamoDBBackend.transact_write_items = _serialized(_transact_write_items)


def _fast_sqs():
    import time

    import moto.sqs.models as sqs
    from moto.core import utils

    def unix_time(dt=None):
        return time.time() if dt is None else utils.unix_time(dt)

    def unix_time_millis(dt=None):
        return time.time() * 1000.0 if dt is None else utils.unix_time_millis(dt)

    # the module's own names: the SQS model calls them unqualified
    sqs.unix_time = unix_time
    sqs.unix_time_millis = unix_time_millis

    def counts(queue):
        now = unix_time_millis()
        ready = delayed = in_flight = 0
        for m in queue._messages:
            if now < m.delayed_until:
                delayed += 1
            if not now > m.visible_at:
                in_flight += 1
            elif not now < m.delayed_until:
                ready += 1
        return ready, delayed, in_flight

    def messages(queue):
        now = unix_time_millis()
        return [m for m in queue._messages if now > m.visible_at and not now < m.delayed_until]

    sqs.Queue.messages = property(messages)
    sqs.Queue.approximate_number_of_messages = property(lambda q: counts(q)[0])
    sqs.Queue.approximate_number_of_messages_delayed = property(lambda q: counts(q)[1])
    sqs.Queue.approximate_number_of_messages_not_visible = property(lambda q: counts(q)[2])

    original_attributes = sqs.Queue.attributes.fget

    def attributes(queue):
        # one pass for the three counts instead of three
        ready, delayed, in_flight = counts(queue)
        result = original_attributes(_Counted(queue, ready, delayed, in_flight))
        return result

    class _Counted:
        """The queue as `attributes` reads it, with the counts already made."""

        def __init__(self, queue, ready, delayed, in_flight):
            self._queue = queue
            self.approximate_number_of_messages = ready
            self.approximate_number_of_messages_delayed = delayed
            self.approximate_number_of_messages_not_visible = in_flight

        def __getattr__(self, name):
            return getattr(self._queue, name)

    sqs.Queue.attributes = property(attributes)

    original_get_attributes = sqs.SQSBackend.get_queue_attributes

    def get_queue_attributes(self, queue_name, attribute_names):
        if not attribute_names or "All" in attribute_names:
            return original_get_attributes(self, queue_name, attribute_names)
        queue = self.get_queue(queue_name)
        valid = set(queue.BASE_ATTRIBUTES + queue.FIFO_ATTRIBUTES + queue.KMS_ATTRIBUTES)
        invalid = next((n for n in attribute_names if n not in valid), None)
        if invalid is not None:
            return original_get_attributes(self, queue_name, attribute_names)  # raises as moto does
        current = queue.attributes  # once, not twice per name
        return {n: current[n] for n in attribute_names if current.get(n) is not None}

    sqs.SQSBackend.get_queue_attributes = get_queue_attributes

    def retained(self, queue_name, message):
        queue = self.get_queue(queue_name)
        return int(queue.message_retention_period) + message.sent_timestamp / 1000 > unix_time()

    sqs.SQSBackend.is_message_valid_based_on_retention_period = retained


_fast_sqs()


def _partition_query():
    from moto.dynamodb.models.table import Table

    original = Table.query

    def query(self, hash_key, range_comparison, range_objs, limit, exclusive_start_key, scan_index_forward,
              projection_expressions, index_name=None, *args, **kwargs):
        call = (self, hash_key, range_comparison, range_objs, limit, exclusive_start_key, scan_index_forward,
                projection_expressions, index_name, *args)
        if index_name is not None or hash_key is None or not self.range_key_attr:
            return original(*call, **kwargs)
        # Calls are serialized (above): the instance attribute shadows `all_items` for this
        # query only. Order is restored by moto's own sort on the range key.
        partition = list(self.items.get(hash_key, {}).values())
        self.all_items = lambda: partition
        try:
            return original(*call, **kwargs)
        finally:
            del self.all_items

    Table.query = _serialized(query)


_partition_query()

if os.environ.get("MOTO_ACCESS_LOG") != "1":
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main(sys.argv[1:]))
