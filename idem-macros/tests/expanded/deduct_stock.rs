async fn deduct_stock(
    store: &impl ::idem_runtime::__private::TxStore<Tx = SqliteTx<'static>>,
    msg: &OrderPlaced,
) -> ::idem_runtime::__private::Result<
    ::idem_runtime::__private::Outcome<StockLeft>,
    ::idem_runtime::__private::Error<AppError>,
> {
    use ::idem_runtime::__private::stores::names::sqlite as __idem_store;
    __idem_store::<::idem_runtime::__private::stores::LeaseMode>();
    __idem_store::<::idem_runtime::__private::stores::TxMode<SqliteTx<'static>>>();
    const __IDEM_SPEC: ::idem_runtime::__private::HandlerSpec = ::idem_runtime::__private::HandlerSpec {
        name: "deduct_stock",
        function: "deduct_stock",
        key: "order_id + sku",
        ttl: ::idem_runtime::__private::Duration::from_millis(86400000u64),
        lease: ::idem_runtime::__private::Duration::from_millis(30000u64),
        store: "sqlite",
        mode: ::idem_runtime::__private::Mode::Transaction,
        module: ::core::module_path!(),
        file: ::core::file!(),
        line: ::core::line!(),
        fingerprint: ::core::option::Option::None,
        max_attempts: ::core::option::Option::None,
    };
    ::idem_runtime::__private::inventory::submit! {
        __IDEM_SPEC
    }
    let __idem_codec = ::idem_runtime::__private::codec::<StockLeft>();
    let __idem_errors = {
        #[allow(unused_imports)]
        use ::idem_runtime::__private::{
            DisplayText as _, ErrorInside as _, ErrorItself as _, FinalErrors as _,
            NoErrorView as _, NoFinalErrors as _, NoText as _,
        };
        ::idem_runtime::__private::ErrorCodec::<
            AppError,
        >::new(
                (&::idem_runtime::__private::ErrorProbe::<AppError>::new()).idem_final(),
                (&::idem_runtime::__private::ErrorProbe::<AppError>::new()).idem_text(),
            )
            .with_view(
                (&&&::idem_runtime::__private::ErrorProbe::<AppError>::new()).idem_view(),
            )
    };
    let __idem_key: ::idem_runtime::__private::Key = {
        use ::idem_runtime::__private::{AnyProbe as _, FloatProbe as _};
        let mut __idem_builder = ::idem_runtime::__private::KeyBuilder::new();
        if __idem_builder
            .part(
                (&::idem_runtime::__private::KeyPartProbe(&(msg).order_id))
                    .idem_key_part()
                    .get(),
            )
            .is_err()
        {
            return ::idem_runtime::__private::key_missing(&__IDEM_SPEC, "order_id");
        }
        if __idem_builder
            .part(
                (&::idem_runtime::__private::KeyPartProbe(&(msg).sku))
                    .idem_key_part()
                    .get(),
            )
            .is_err()
        {
            return ::idem_runtime::__private::key_missing(&__IDEM_SPEC, "sku");
        }
        __idem_builder.finish()
    };
    let __idem_fingerprint: ::idem_runtime::__private::Option<
        ::idem_runtime::__private::String,
    > = ::idem_runtime::__private::Option::None;
    let mut __idem_call = match ::idem_runtime::__private::tx_begin::<
        _,
        StockLeft,
        AppError,
    >(
            store,
            &__IDEM_SPEC,
            &__idem_key,
            __idem_fingerprint.as_deref(),
            __idem_codec,
            __idem_errors,
        )
        .await
    {
        ::idem_runtime::__private::Result::Ok(
            ::idem_runtime::__private::TxBegin::Fresh(call),
        ) => call,
        ::idem_runtime::__private::Result::Ok(
            ::idem_runtime::__private::TxBegin::Done(outcome),
        ) => return ::idem_runtime::__private::Result::Ok(outcome),
        ::idem_runtime::__private::Result::Err(error) => {
            return ::idem_runtime::__private::Result::Err(error);
        }
    };
    let __idem_span = __idem_call.span();
    let __idem_tx = __idem_call.tx();
    let __idem_result: Result<StockLeft, AppError> = ::idem_runtime::__private::Instrument::instrument(
            async move {
                let tx: &mut SqliteTx<'_> = __idem_tx;
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value,
                    clippy::let_with_type_underscore,
                    clippy::needless_return,
                    clippy::unreachable
                )]
                if false {
                    let __idem_fake_return: Result<StockLeft, AppError> = loop {};
                    return __idem_fake_return;
                }
                let left = sqlx::query_scalar(
                        "UPDATE inventory SET stock = stock - ? WHERE sku = ? RETURNING stock",
                    )
                    .bind(msg.qty)
                    .bind(&msg.sku)
                    .fetch_one(&mut **tx)
                    .await?;
                Ok(StockLeft(left))
            },
            __idem_span,
        )
        .await;
    ::idem_runtime::__private::tx_finish::<
        _,
        StockLeft,
        AppError,
    >(
            store,
            &__IDEM_SPEC,
            &__idem_key,
            __idem_fingerprint.as_deref(),
            __idem_codec,
            __idem_errors,
            __idem_call,
            __idem_result,
        )
        .await
}
