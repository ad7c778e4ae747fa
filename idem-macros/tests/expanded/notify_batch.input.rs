#[idempotent(key = "order_id", ttl = "3d", store = "redis", fingerprint = "phone")]
async fn notify(msgs: &[OrderShipped]) -> Result<Vec<SmsId>, GatewayError> {
    sms::send_all(msgs.iter().map(|m| (&m.phone, "Your order has shipped"))).await
}
