async fn deduct_stock(
    store: &impl ::idem_runtime::__private::TxStore<Tx = PgTx<'static>>,
    msgs: &[OrderPlaced],
) -> ::idem_runtime::__private::Result<
    ::idem_runtime::__private::Results<StockLeft, AppError>,
    ::idem_runtime::__private::Error<AppError>,
> {
    use ::idem_runtime::__private::stores::names::postgres as __idem_store;
    __idem_store::<::idem_runtime::__private::stores::LeaseMode>();
    __idem_store::<::idem_runtime::__private::stores::TxMode<PgTx<'static>>>();
    const __IDEM_SPEC: ::idem_runtime::__private::HandlerSpec = ::idem_runtime::__private::HandlerSpec {
        name: "deduct_stock",
        function: "deduct_stock",
        key: "order_id + sku",
        ttl: ::idem_runtime::__private::Duration::from_millis(86400000u64),
        lease: ::idem_runtime::__private::Duration::from_millis(30000u64),
        store: "postgres",
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
    let __idem_derived = {
        let mut __idem_all: ::idem_runtime::__private::Vec<
            ::idem_runtime::__private::Derived<AppError>,
        > = ::idem_runtime::__private::Vec::with_capacity(msgs.len());
        for __idem_msg in msgs {
            __idem_all
                .push('__idem_derive: {
                    let __idem_key: ::idem_runtime::__private::Key = {
                        use ::idem_runtime::__private::{AnyProbe as _, FloatProbe as _};
                        let mut __idem_builder = ::idem_runtime::__private::KeyBuilder::new();
                        if __idem_builder
                            .part(
                                (&::idem_runtime::__private::KeyPartProbe(
                                    &(__idem_msg).order_id,
                                ))
                                    .idem_key_part()
                                    .get(),
                            )
                            .is_err()
                        {
                            let __idem_missing: ::idem_runtime::__private::Derived<
                                AppError,
                            > = ::idem_runtime::__private::Result::Err(::idem_runtime::__private::Error::KeyMissing {
                                handler: __IDEM_SPEC.name,
                                part: "order_id",
                            });
                            break '__idem_derive __idem_missing;
                        }
                        if __idem_builder
                            .part(
                                (&::idem_runtime::__private::KeyPartProbe(
                                    &(__idem_msg).sku,
                                ))
                                    .idem_key_part()
                                    .get(),
                            )
                            .is_err()
                        {
                            let __idem_missing: ::idem_runtime::__private::Derived<
                                AppError,
                            > = ::idem_runtime::__private::Result::Err(::idem_runtime::__private::Error::KeyMissing {
                                handler: __IDEM_SPEC.name,
                                part: "sku",
                            });
                            break '__idem_derive __idem_missing;
                        }
                        __idem_builder.finish()
                    };
                    ::idem_runtime::__private::Result::Ok((
                        __idem_key,
                        ::idem_runtime::__private::Option::None,
                    ))
                });
        }
        __idem_all
    };
    ::idem_runtime::__private::batch_message::<OrderPlaced>();
    let __idem_batch = {
        #[allow(unused_imports)]
        use ::idem_runtime::__private::{AnyBatch as _, CloneBatch as _};
        (&::idem_runtime::__private::BatchProbe::<OrderPlaced>::new()).idem_batch()
    };
    let mut __idem_run = ::idem_runtime::__private::TxBatchRun::<
        _,
        StockLeft,
        AppError,
    >::new(store, &__IDEM_SPEC, msgs.len(), __idem_derived, __idem_codec, __idem_errors);
    loop {
        let mut __idem_call = match __idem_run.begin().await {
            ::idem_runtime::__private::Result::Ok(
                ::idem_runtime::__private::TxBatchBegin::Fresh(call),
            ) => call,
            ::idem_runtime::__private::Result::Ok(
                ::idem_runtime::__private::TxBatchBegin::Done(results),
            ) => {
                return ::idem_runtime::__private::Result::Ok(results);
            }
            ::idem_runtime::__private::Result::Err(error) => {
                return ::idem_runtime::__private::Result::Err(error);
            }
        };
        let __idem_fresh = __idem_batch.fresh(&__idem_run, msgs, &__idem_call);
        let __idem_span = __idem_run.span();
        let __idem_tx = __idem_call.tx();
        let __idem_result: Result<Vec<StockLeft>, AppError> = ::idem_runtime::__private::Instrument::instrument(
                async {
                    let tx: &mut PgTx<'_> = __idem_tx;
                    let msgs: &[OrderPlaced] = &*__idem_fresh;
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
                        let __idem_fake_return: Result<Vec<StockLeft>, AppError> = loop {};
                        return __idem_fake_return;
                    }
                    let mut left = Vec::with_capacity(msgs.len());
                    for msg in msgs {
                        left.push(inventory::deduct(tx, &msg.sku, msg.qty).await?);
                    }
                    Ok(left)
                },
                __idem_span,
            )
            .await;
        if let ::idem_runtime::__private::TxBatchStep::Done(results) = __idem_run
            .finish(__idem_call, __idem_result)
            .await
        {
            return results;
        }
    }
}
