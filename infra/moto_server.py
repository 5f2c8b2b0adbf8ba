"""moto's server, with its SQS made linear.

`make test` takes SQS, SNS and SES from moto and DynamoDB (with its streams) from AWS's DynamoDB
Local (`infra/dynamodb_local.sh`): moto's DynamoDB rolled back other clients' writes when a
transaction failed and copied the whole table for every item of a transaction, and serializing
it to hide that also hid the conflicts real DynamoDB has. Nothing here touches DynamoDB.

SQS is made linear (`_fast_sqs` below): moto reads the clock through two datetime conversions
for every message it looks at, recomputes every queue attribute (three passes over all
messages) on each SendMessage and, per message received, on the retention check, and twice
per name in GetQueueAttributes. With a few thousand messages queued, a campaign of 2,000 ran
at about 14 requests per second and starved every other test sharing the emulator. The
patched clock and one-pass counts change no behaviour, only the cost. The per-request access
log (a lock every thread waits on) is off unless `MOTO_ACCESS_LOG=1`.

usage: python moto_server.py -H 127.0.0.1 -p 5005   (same arguments as moto_server)
"""

import logging
import os
import sys


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

if os.environ.get("MOTO_ACCESS_LOG") != "1":
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main(sys.argv[1:]))
