#[idempotent(key = "payment_id", ttl = "7d", store = "redis", fingerprint = "amount + currency", max_attempts = 3)]
async fn capture_payment(msg: &PaymentCaptured) -> Result<Receipt, GatewayError> {
    gateway::capture(msg.payment_id, msg.amount, &msg.currency).await
}
