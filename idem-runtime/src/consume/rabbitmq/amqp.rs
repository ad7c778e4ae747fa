//! What the consumer and its dead letters both do with RabbitMQ: read and
//! write headers, copy a message's properties, and publish a copy with the
//! broker's confirm.

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};

/// How a confirmed publish ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Published {
    /// The broker took the copy.
    Taken,
    /// The broker returned it: no queue of that name.
    Unrouted,
    /// The broker refused it (a nack).
    Refused,
}

/// Publishes a copy of `delivery` (its payload and identity, see
/// [`copy_properties`]; with `headers`, less `CC` and `BCC`, which would
/// route it elsewhere too) to queue `to` through the default exchange,
/// persistent and `mandatory`, so a missing queue returns it instead of
/// dropping it, and waits for the broker's confirm.
pub(super) async fn publish_copy(
    channel: &Channel,
    delivery: &lapin::message::Delivery,
    to: &str,
    headers: FieldTable,
    payload: &[u8],
) -> Result<Published, lapin::Error> {
    let mut kept = FieldTable::default();
    for (name, value) in headers.inner() {
        if name.as_str() != "CC" && name.as_str() != "BCC" {
            kept.insert(name.clone(), value.clone());
        }
    }
    let properties = copy_properties(&delivery.properties, kept);
    let mandatory = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let confirm = channel
        .basic_publish(
            ShortString::from(""),
            to.into(),
            mandatory,
            payload,
            properties,
        )
        .await?
        .await?;
    Ok(if !confirm.is_ack() {
        Published::Refused
    } else if confirm.take_message().is_some() {
        Published::Unrouted
    } else {
        Published::Taken
    })
}

/// The properties of a copy of a message (a retry, a dead letter, a
/// replayed dead letter): persistent, with `headers`, keeping the
/// message's identity (content type and encoding, message and correlation
/// id, timestamp, type, priority, reply to, app id) but not `expiration`,
/// which would drop the copy.
pub(crate) fn copy_properties(original: &BasicProperties, headers: FieldTable) -> BasicProperties {
    let mut properties = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(2);
    if let Some(v) = original.content_type() {
        properties = properties.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        properties = properties.with_content_encoding(v.clone());
    }
    if let Some(v) = original.message_id() {
        properties = properties.with_message_id(v.clone());
    }
    if let Some(v) = original.correlation_id() {
        properties = properties.with_correlation_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        properties = properties.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        properties = properties.with_type(v.clone());
    }
    if let Some(v) = original.priority() {
        properties = properties.with_priority(*v);
    }
    if let Some(v) = original.reply_to() {
        properties = properties.with_reply_to(v.clone());
    }
    if let Some(v) = original.app_id() {
        properties = properties.with_app_id(v.clone());
    }
    properties
}

/// A header's value as text: strings as they are, numbers in decimal,
/// anything else as its debug form.
pub(super) fn amqp_text(value: &AMQPValue) -> Vec<u8> {
    match value {
        AMQPValue::LongString(v) => v.as_bytes().to_vec(),
        AMQPValue::ShortString(v) => v.as_str().as_bytes().to_vec(),
        AMQPValue::ByteArray(v) => v.as_slice().to_vec(),
        AMQPValue::Boolean(v) => v.to_string().into_bytes(),
        AMQPValue::ShortShortInt(v) => v.to_string().into_bytes(),
        AMQPValue::ShortShortUInt(v) => v.to_string().into_bytes(),
        AMQPValue::ShortInt(v) => v.to_string().into_bytes(),
        AMQPValue::ShortUInt(v) => v.to_string().into_bytes(),
        AMQPValue::LongInt(v) => v.to_string().into_bytes(),
        AMQPValue::LongUInt(v) => v.to_string().into_bytes(),
        AMQPValue::LongLongInt(v) => v.to_string().into_bytes(),
        AMQPValue::Timestamp(v) => v.to_string().into_bytes(),
        other => format!("{other:?}").into_bytes(),
    }
}

pub(super) fn header_u32(headers: &FieldTable, name: &str) -> u32 {
    let n = header_u64(headers, name).unwrap_or(0);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A whole-number header, negatives as 0; `None` when absent or not a
/// number.
pub(super) fn header_u64(headers: &FieldTable, name: &str) -> Option<u64> {
    let value = headers.inner().get(&ShortString::from(name));
    let n: i128 = match value {
        Some(AMQPValue::LongLongInt(n)) => (*n).into(),
        Some(AMQPValue::LongInt(n)) => (*n).into(),
        Some(AMQPValue::LongUInt(n)) => (*n).into(),
        Some(AMQPValue::ShortInt(n)) => (*n).into(),
        Some(AMQPValue::ShortUInt(n)) => (*n).into(),
        Some(AMQPValue::ShortShortInt(n)) => (*n).into(),
        Some(AMQPValue::ShortShortUInt(n)) => (*n).into(),
        Some(AMQPValue::Timestamp(n)) => (*n).into(),
        _ => return None,
    };
    Some(u64::try_from(n.max(0)).unwrap_or(u64::MAX))
}

pub(super) fn set(headers: &mut FieldTable, name: &str, value: u64) {
    headers.insert(
        name.into(),
        AMQPValue::LongLongInt(i64::try_from(value).unwrap_or(i64::MAX)),
    );
}

pub(super) fn set_text(headers: &mut FieldTable, name: &str, value: &str) {
    // Header values are bounded; a long error message is cut.
    let value: String = value.chars().take(4_000).collect();
    headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
}
