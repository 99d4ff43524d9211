//! A checkpoint of a table's log: the actions that make a version, as one
//! Parquet file (`<version>.checkpoint.parquet`) in the schema the Delta
//! protocol gives, so a reader opens the table from it and the versions
//! after it rather than from every version since the first.
//!
//! Actions are written from their JSON form by one shredder over the
//! schema (definition and repetition levels, Dremel style), and read back
//! into JSON, so the log's one action reader ([`super::Snapshot`]) applies
//! both.

use std::sync::Arc;

use bytes::Bytes;
use parquet::{
    basic::{Compression, Repetition, Type as Physical, ZstdLevel},
    data_type::{BoolType, ByteArray, ByteArrayType, Int32Type, Int64Type},
    file::{
        properties::WriterProperties,
        reader::{FileReader, SerializedFileReader},
        writer::SerializedFileWriter,
    },
    record::Field,
    schema::{parser::parse_message_type, types::Type},
};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The protocol's checkpoint schema, the fields this writer uses (readers
/// take missing optional fields as null).
const SCHEMA: &str = "message spark_schema {
    optional group txn {
        optional binary appId (STRING);
        optional int64 version;
        optional int64 lastUpdated;
    }
    optional group add {
        optional binary path (STRING);
        optional group partitionValues (MAP) {
            repeated group key_value {
                required binary key (STRING);
                optional binary value (STRING);
            }
        }
        optional int64 size;
        optional int64 modificationTime;
        optional boolean dataChange;
        optional binary stats (STRING);
    }
    optional group remove {
        optional binary path (STRING);
        optional int64 deletionTimestamp;
        optional boolean dataChange;
        optional boolean extendedFileMetadata;
        optional group partitionValues (MAP) {
            repeated group key_value {
                required binary key (STRING);
                optional binary value (STRING);
            }
        }
        optional int64 size;
    }
    optional group metaData {
        optional binary id (STRING);
        optional binary name (STRING);
        optional binary description (STRING);
        optional group format {
            optional binary provider (STRING);
            optional group options (MAP) {
                repeated group key_value {
                    required binary key (STRING);
                    optional binary value (STRING);
                }
            }
        }
        optional binary schemaString (STRING);
        optional group partitionColumns (LIST) {
            repeated group list {
                optional binary element (STRING);
            }
        }
        optional group configuration (MAP) {
            repeated group key_value {
                required binary key (STRING);
                optional binary value (STRING);
            }
        }
        optional int64 createdTime;
    }
    optional group protocol {
        optional int32 minReaderVersion;
        optional int32 minWriterVersion;
    }
}";

/// One leaf column's values and levels.
#[derive(Default)]
struct Column {
    text: Vec<ByteArray>,
    long: Vec<i64>,
    int: Vec<i32>,
    flag: Vec<bool>,
    defs: Vec<i16>,
    reps: Vec<i16>,
}

fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("a checkpoint: {e}"))
}

/// The checkpoint file of `actions` (each `{"add": {…}}` and the like).
pub fn write(actions: &[Value]) -> Result<Vec<u8>> {
    let schema = Arc::new(parse_message_type(SCHEMA).map_err(corrupt)?);
    let mut leaves = Vec::new();
    collect_leaves(&schema, &mut leaves);
    let mut columns: Vec<Column> = leaves.iter().map(|_| Column::default()).collect();
    for action in actions {
        let mut at = 0;
        for field in schema.get_fields() {
            shred(
                field,
                action.get(field.name()),
                0,
                0,
                0,
                &mut columns,
                &mut at,
            )?;
        }
    }
    let props = Arc::new(
        WriterProperties::builder()
            // zstd: the codec this build carries, which every reader takes.
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build(),
    );
    let mut writer = SerializedFileWriter::new(Vec::new(), schema, props).map_err(corrupt)?;
    let mut group = writer.next_row_group().map_err(corrupt)?;
    let mut n = 0;
    while let Some(mut column) = group.next_column().map_err(corrupt)? {
        let c = &columns[n];
        let (defs, reps) = (Some(&c.defs[..]), Some(&c.reps[..]));
        match leaves[n] {
            Physical::BYTE_ARRAY => column
                .typed::<ByteArrayType>()
                .write_batch(&c.text, defs, reps),
            Physical::INT64 => column.typed::<Int64Type>().write_batch(&c.long, defs, reps),
            Physical::INT32 => column.typed::<Int32Type>().write_batch(&c.int, defs, reps),
            _ => column.typed::<BoolType>().write_batch(&c.flag, defs, reps),
        }
        .map_err(corrupt)?;
        column.close().map_err(corrupt)?;
        n += 1;
    }
    group.close().map_err(corrupt)?;
    writer.into_inner().map_err(corrupt)
}

/// The leaves' physical types, in column order.
fn collect_leaves(ty: &Type, out: &mut Vec<Physical>) {
    if ty.is_primitive() {
        out.push(ty.get_physical_type());
    } else {
        for field in ty.get_fields() {
            collect_leaves(field, out);
        }
    }
}

/// Writes `value` (at `ty`, under `def` defined and `depth` repeated
/// ancestors, this entry repeating at level `rep`) into the leaves from
/// `*at` on.
fn shred(
    ty: &Type,
    value: Option<&Value>,
    def: i16,
    rep: i16,
    depth: i16,
    columns: &mut [Column],
    at: &mut usize,
) -> Result<()> {
    let value = value.filter(|v| !v.is_null());
    let optional = ty.get_basic_info().repetition() == Repetition::OPTIONAL;
    let Some(value) = value else {
        if !optional && ty.is_primitive() {
            return Err(corrupt(format!("{} is required", ty.name())));
        }
        nulls(ty, def, rep, columns, at);
        return Ok(());
    };
    let def = def + i16::from(optional);
    if ty.is_primitive() {
        let column = &mut columns[*at];
        *at += 1;
        column.defs.push(def);
        column.reps.push(rep);
        match ty.get_physical_type() {
            Physical::BYTE_ARRAY => {
                let text = value
                    .as_str()
                    .map_or_else(|| value.to_string(), str::to_owned);
                column.text.push(ByteArray::from(text.into_bytes()));
            }
            Physical::INT64 => column.long.push(value.as_i64().unwrap_or_default()),
            Physical::INT32 => column.int.push(value.as_i64().unwrap_or_default() as i32),
            _ => column.flag.push(value.as_bool().unwrap_or_default()),
        }
        return Ok(());
    }
    let fields = ty.get_fields();
    // A map or a list: one repeated group inside, an entry per element.
    if let [inner] = fields
        && inner.get_basic_info().repetition() == Repetition::REPEATED
    {
        // Each entry's values, one per field of the repeated group.
        let entries: Vec<Vec<Option<Value>>> = match value {
            Value::Object(map) => map
                .iter()
                .map(|(k, v)| vec![Some(Value::String(k.clone())), Some(v.clone())])
                .collect(),
            Value::Array(items) => items.iter().map(|v| vec![Some(v.clone())]).collect(),
            _ => return Err(corrupt(format!("{} is not a map or a list", ty.name()))),
        };
        if entries.is_empty() {
            nulls(inner, def, rep, columns, at);
            return Ok(());
        }
        let start = *at;
        for (i, entry) in entries.iter().enumerate() {
            *at = start;
            let r = if i == 0 { rep } else { depth + 1 };
            for (field, v) in inner.get_fields().iter().zip(entry) {
                shred(field, v.as_ref(), def + 1, r, depth + 1, columns, at)?;
            }
        }
        return Ok(());
    }
    for field in fields {
        shred(field, value.get(field.name()), def, rep, depth, columns, at)?;
    }
    Ok(())
}

/// Every leaf under `ty` absent at this level.
fn nulls(ty: &Type, def: i16, rep: i16, columns: &mut [Column], at: &mut usize) {
    if ty.is_primitive() {
        columns[*at].defs.push(def);
        columns[*at].reps.push(rep);
        *at += 1;
    } else {
        for field in ty.get_fields() {
            nulls(field, def, rep, columns, at);
        }
    }
}

/// The actions of a checkpoint file, as JSON (a row's one non-null column
/// each).
pub fn read(bytes: Bytes) -> Result<Vec<Value>> {
    let reader = SerializedFileReader::new(bytes).map_err(corrupt)?;
    let mut out = Vec::new();
    for row in reader.get_row_iter(None).map_err(corrupt)? {
        let row = row.map_err(corrupt)?;
        let mut action = Map::new();
        for (name, field) in row.get_column_iter() {
            if !matches!(field, Field::Null) {
                action.insert(name.clone(), json(field));
            }
        }
        out.push(Value::Object(action));
    }
    Ok(out)
}

fn json(field: &Field) -> Value {
    match field {
        Field::Null => Value::Null,
        Field::Bool(b) => Value::Bool(*b),
        Field::Byte(n) => Value::from(*n),
        Field::Short(n) => Value::from(*n),
        Field::Int(n) => Value::from(*n),
        Field::Long(n) => Value::from(*n),
        Field::UByte(n) => Value::from(*n),
        Field::UShort(n) => Value::from(*n),
        Field::UInt(n) => Value::from(*n),
        Field::ULong(n) => Value::from(*n),
        Field::Str(s) => Value::String(s.clone()),
        Field::Group(row) => Value::Object(
            row.get_column_iter()
                .map(|(name, f)| (name.clone(), json(f)))
                .collect(),
        ),
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(json).collect()),
        Field::MapInternal(map) => Value::Object(
            map.entries()
                .iter()
                .map(|(k, v)| {
                    let key = match json(k) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, json(v))
                })
                .collect(),
        ),
        // Types this schema never holds (floats, times, bytes).
        other => Value::String(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn actions_round_trip_through_a_checkpoint() {
        let actions = vec![
            json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
            json!({"metaData": {
                "id": "m", "format": {"provider": "parquet", "options": {}},
                "schemaString": "{}", "partitionColumns": ["date"],
                "configuration": {"a": "1", "b": "2"}, "createdTime": 5,
            }}),
            json!({"txn": {"appId": "batch-1", "version": 0, "lastUpdated": 7}}),
            json!({"add": {
                "path": "date=2026-12-07/x.parquet", "partitionValues": {"date": "2026-12-07"},
                "size": 10, "modificationTime": 8, "dataChange": false, "stats": "{\"numRecords\":3}",
            }}),
            json!({"add": {
                "path": "date=2026-12-08/y.parquet", "partitionValues": {"date": null},
                "size": 11, "modificationTime": 9, "dataChange": false,
            }}),
            json!({"remove": {"path": "z.parquet", "deletionTimestamp": 6, "dataChange": true}}),
        ];
        let read = read(Bytes::from(write(&actions).unwrap())).unwrap();
        assert_eq!(read.len(), actions.len());
        assert_eq!(read[0]["protocol"]["minWriterVersion"], 2);
        assert_eq!(read[1]["metaData"]["partitionColumns"], json!(["date"]));
        assert_eq!(
            read[1]["metaData"]["configuration"],
            json!({"a": "1", "b": "2"})
        );
        assert_eq!(read[1]["metaData"]["format"]["provider"], "parquet");
        assert_eq!(read[2]["txn"]["appId"], "batch-1");
        assert_eq!(
            read[3]["add"]["partitionValues"],
            json!({"date": "2026-12-07"})
        );
        assert_eq!(read[3]["add"]["stats"], "{\"numRecords\":3}");
        assert_eq!(read[4]["add"]["partitionValues"], json!({"date": null}));
        assert_eq!(read[4]["add"]["size"], 11);
        assert_eq!(read[5]["remove"]["path"], "z.parquet");
        assert!(read[5].get("add").is_none());
    }
}
