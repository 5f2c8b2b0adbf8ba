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

moto's restore also replaced the table object, and with it the stream shard that open shard
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

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main(sys.argv[1:]))
