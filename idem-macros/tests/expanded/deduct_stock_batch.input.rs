#[idempotent(key = "order_id + sku", ttl = "24h", store = "postgres")]
async fn deduct_stock(tx: &mut PgTx<'_>, msgs: &[OrderPlaced]) -> Result<Vec<StockLeft>, AppError> {
    let mut left = Vec::with_capacity(msgs.len());
    for msg in msgs {
        left.push(inventory::deduct(tx, &msg.sku, msg.qty).await?);
    }
    Ok(left)
}
