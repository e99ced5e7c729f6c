use super::*;

fn shape(prefill: &[(u64, u64)], decode_contexts: &[u64]) -> BatchShape {
    // (chunk, tokens before the chunk) per prefill; context per decode.
    let mut s = BatchShape {
        num_requests: (prefill.len() + decode_contexts.len()) as u32,
        ..BatchShape::default()
    };
    for &(c, p) in prefill {
        s.num_prefill_tokens += c;
        s.sum_prefill_context += c * (p + c);
        s.sum_prefill_squared += c * c;
    }
    s.num_decode_tokens = decode_contexts.len() as u64;
    s.sum_decode_context = decode_contexts.iter().sum();
    s
}

fn roofline(flops: &[(Feature, f64)], bytes: &[(Feature, f64)], latency_s: f64) -> Roofline {
    let mut dense_flops = [0.0; NUM_FEATURES];
    let mut dense_bytes = [0.0; NUM_FEATURES];
    for &(f, c) in flops {
        dense_flops[f as usize] = c;
    }
    for &(f, c) in bytes {
        dense_bytes[f as usize] = c;
    }
    Roofline::new("test", &dense_flops, &dense_bytes, 1e12, 1e9, latency_s).unwrap()
}

fn op(name: &str, scope: Scope, gate: Feature, cost: Cost) -> Op {
    Op {
        name: name.into(),
        scope,
        count: 1.0,
        gate,
        cost,
    }
}

fn table_1d(xs: &[f64], values: &[f64]) -> Table {
    Table::new(
        Feature::NumTokens,
        None,
        xs.to_vec(),
        vec![],
        values.to_vec(),
    )
}

#[test]
fn features_of_a_mixed_batch() {
    // A 4-token chunk after 6 cached tokens: pairs 4·6 + 4·5/2 = 34. A plain 2-token
    // prompt: 2·3/2 = 3. Decodes with 9 and 19 cached tokens read 10 + 20 keys.
    let mut s = shape(&[(4, 6), (2, 0)], &[9, 19]);
    s.num_padding_rows = 2;
    let f = Features::of(&s);
    assert_eq!(f.get(Feature::NumTokens), 10.0);
    assert_eq!(f.get(Feature::NumPrefillTokens), 6.0);
    assert_eq!(f.get(Feature::NumDecodeTokens), 2.0);
    assert_eq!(f.get(Feature::NumRequests), 4.0);
    assert_eq!(f.get(Feature::PrefillAttentionPairs), 37.0);
    assert_eq!(f.get(Feature::DecodeAttentionKeys), 30.0);
    assert_eq!(f.get(Feature::PrefillMeanContext), 37.0 / 6.0);
    assert_eq!(f.get(Feature::DecodeMeanContext), 15.0);
    let empty = Features::of(&BatchShape::default());
    assert_eq!(empty.get(Feature::PrefillMeanContext), 0.0);
    assert_eq!(empty.get(Feature::DecodeMeanContext), 0.0);
}

#[test]
fn feature_names_round_trip() {
    for f in Feature::ALL {
        assert_eq!(Feature::from_name(f.name()), Some(f));
    }
    assert_eq!(Feature::from_name("tokens"), None);
}

#[test]
fn roofline_takes_the_slower_of_compute_and_memory() {
    // 1 TFLOP/s and 1 GB/s: 2e9 FLOPs per token against 1e6 bytes + 1e3 bytes per token.
    let flops = [(Feature::NumTokens, 2e9)];
    let bytes = [(Feature::One, 1e6), (Feature::NumTokens, 1e3)];
    let r = roofline(&flops, &bytes, 0.0);
    let tokens = |n: u64| Features::of(&shape(&[(n, 0)], &[]));
    // One token: compute 2 ms, memory 1.001 ms → 2 ms.
    assert!((r.time(&tokens(1)) - 2e-3).abs() < 1e-15);
    let latency = roofline(&flops, &bytes, 5e-6);
    assert!((latency.time(&tokens(1)) - 2.005e-3).abs() < 1e-15);
    let memory_bound = roofline(&[(Feature::NumTokens, 1.0)], &[(Feature::One, 1e6)], 0.0);
    assert!((memory_bound.time(&tokens(1)) - 1e-3).abs() < 1e-15);
}

#[test]
fn one_feature_table_interpolates_holds_below_and_extends_above() {
    let t = table_1d(&[2.0, 4.0, 8.0], &[1.0, 2.0, 6.0]);
    let at = |n: u64| t.time(&Features::of(&shape(&[(n, 0)], &[])));
    assert_eq!(at(1), 1.0); // below the grid: the edge value
    assert_eq!(at(2), 1.0);
    assert_eq!(at(3), 1.5);
    assert_eq!(at(6), 4.0);
    assert_eq!(at(8), 6.0);
    assert_eq!(at(10), 8.0); // the last segment extended: slope 1 per token
    let noisy = table_1d(&[2.0, 4.0], &[3.0, 2.0]);
    let noisy_at = |n: u64| noisy.time(&Features::of(&shape(&[(n, 0)], &[])));
    assert_eq!(noisy_at(3), 2.5);
    assert_eq!(noisy_at(100), 2.0); // a falling last segment is not extended
    let single = table_1d(&[4.0], &[7.0]);
    assert_eq!(single.time(&Features::of(&shape(&[(9, 0)], &[]))), 7.0);
}

/// values = batch + context / 100 on batch {1, 3} × mean context {100, 300}.
fn batch_by_context_table() -> Table {
    Table::new(
        Feature::NumDecodeTokens,
        Some(Feature::DecodeMeanContext),
        vec![1.0, 3.0],
        vec![100.0, 300.0],
        vec![2.0, 4.0, 4.0, 6.0],
    )
}

#[test]
fn two_feature_table_is_bilinear() {
    let t = batch_by_context_table();
    // Two decodes reading 200 keys each (199 cached + the new token): 2 + 2 = 4.
    assert!((t.time(&Features::of(&shape(&[], &[199, 199]))) - 4.0).abs() < 1e-12);
    // Four decodes of 500 keys: both axes extended, 4 + 5 = 9.
    let big = Features::of(&shape(&[], &[499, 499, 499, 499]));
    assert!((t.time(&big) - 9.0).abs() < 1e-12);
}

#[test]
fn stage_time_sums_ops_by_scope_and_skips_gated_ones() {
    let constant = |s: f64| Cost::Roofline(roofline(&[], &[], s));
    let mut model = OpModel {
        ops: vec![
            op("layer", Scope::Layer, Feature::NumTokens, constant(1.0)),
            op(
                "embedding",
                Scope::FirstStage,
                Feature::NumTokens,
                constant(10.0),
            ),
            op(
                "lm_head",
                Scope::LastStage,
                Feature::NumTokens,
                constant(100.0),
            ),
            op(
                "send",
                Scope::BetweenStages,
                Feature::NumTokens,
                constant(1000.0),
            ),
            op(
                "decode",
                Scope::Layer,
                Feature::NumDecodeTokens,
                constant(1e4),
            ),
        ],
        num_layers: 4,
        cpu_overhead_s: 0.5,
    };
    model.ops[0].count = 2.0;
    model.validate(2).unwrap();
    let prefill = shape(&[(8, 0)], &[]);
    // One stage: 4 layers × 2 + embedding + lm_head; no decodes, no send.
    let whole = model.stage_time(&prefill, 0, 1).unwrap();
    assert_eq!(whole.model_s, 118.0);
    assert_eq!(whole.total_s, 118.5);
    // Two stages: 2 layers × 2 each; the first embeds and sends, the last samples.
    assert_eq!(model.stage_time(&prefill, 0, 2).unwrap().model_s, 1014.0);
    assert_eq!(model.stage_time(&prefill, 1, 2).unwrap().model_s, 104.0);
    let with_decode = shape(&[(8, 0)], &[5]);
    assert_eq!(
        model.stage_time(&with_decode, 0, 1).unwrap().model_s,
        118.0 + 4e4
    );
    let times = model.op_times(&with_decode, 1, 2);
    assert_eq!(times[4], ("decode", 2e4));
}

#[test]
fn validation_names_the_bad_array() {
    let model = |cost: Cost| OpModel {
        ops: vec![op("qkv_proj", Scope::Layer, Feature::NumTokens, cost)],
        num_layers: 4,
        cpu_overhead_s: 0.0,
    };
    let field_of = |m: OpModel, stages: u32| match m.validate(stages) {
        Err(Error::Config { field, value, .. }) => (field, value),
        other => panic!("expected a config error, got {other:?}"),
    };
    let good = model(Cost::Table(table_1d(&[1.0, 2.0], &[1.0, 2.0])));
    assert!(good.validate(2).is_ok());
    assert_eq!(field_of(good, 3).0, "replica.num_pipeline_stages");
    let unsorted = model(Cost::Table(table_1d(&[2.0, 1.0], &[1.0, 2.0])));
    let (field, value) = field_of(unsorted, 1);
    assert_eq!(field, "execution.ops.xs");
    assert!(value.starts_with("qkv_proj"));
    let short = model(Cost::Table(table_1d(&[1.0, 2.0], &[1.0])));
    assert_eq!(field_of(short, 1).0, "execution.ops.values");
    let negative = model(Cost::Table(table_1d(&[1.0], &[-1.0])));
    assert_eq!(field_of(negative, 1).0, "execution.ops.values");
    let zero = [0.0; NUM_FEATURES];
    match Roofline::new("qkv_proj", &zero, &zero, 0.0, 1.0, 0.0) {
        Err(Error::Config { field, value, .. }) => {
            assert_eq!(field, "execution.ops.roofline");
            assert_eq!(value, "qkv_proj: 0");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn lookups_give_the_same_answer_whatever_the_last_one_was() {
    let xs: Vec<f64> = (0..20).map(|i| f64::from(1 << i)).collect();
    let values: Vec<f64> = xs.iter().map(|x| x.sqrt()).collect();
    let hinted = table_1d(&xs, &values);
    let mut state = 7u64;
    for _ in 0..5000 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let n = (state >> 33) % 2_000_000;
        let features = Features::of(&shape(&[(n.max(1), 0)], &[]));
        // A fresh table has no hint: it searches every time.
        let fresh = table_1d(&xs, &values);
        assert_eq!(hinted.time(&features), fresh.time(&features));
    }
}

#[test]
fn a_repeated_point_gives_its_answer_and_a_moved_one_is_looked_up() {
    let t = batch_by_context_table();
    // Two decodes at 200 keys (4.0), again, then the same two at 300 keys (5.0): the
    // second feature moved alone, so the last answer must not be reused.
    let at_200 = Features::of(&shape(&[], &[199, 199]));
    let at_300 = Features::of(&shape(&[], &[299, 299]));
    for (features, expected) in [
        (&at_200, 4.0),
        (&at_200, 4.0),
        (&at_300, 5.0),
        (&at_200, 4.0),
    ] {
        assert!((t.time(features) - expected).abs() < 1e-12, "{expected}");
    }
}
