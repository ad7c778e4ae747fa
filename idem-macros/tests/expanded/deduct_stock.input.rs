#[idempotent(key = "order_id + sku", ttl = "24h", store = "sqlite")]
async fn deduct_stock(tx: &mut SqliteTx<'_>, msg: &OrderPlaced) -> Result<StockLeft, AppError> {
    let left = sqlx::query_scalar("UPDATE inventory SET stock = stock - ? WHERE sku = ? RETURNING stock")
        .bind(msg.qty).bind(&msg.sku).fetch_one(&mut **tx).await?;
    Ok(StockLeft(left))
}
