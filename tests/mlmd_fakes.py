"""An in-memory ML Metadata store with hand-built lineage, for the resolver and mlmd tests."""

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2
from tfx.types import standard_artifacts

PIPELINE = "p"


class Lineage:
    """Artifacts and executions in a fake (in-memory) MLMD database."""

    def __init__(self):
        config = metadata_store_pb2.ConnectionConfig()
        config.fake_database.SetInParent()
        self.store = metadata_store.MetadataStore(config)
        self.execution_type = self.store.put_execution_type(metadata_store_pb2.ExecutionType(name="step"))
        self.node_type = self.store.put_context_type(metadata_store_pb2.ContextType(name="node"))
        self.run_type = self.store.put_context_type(metadata_store_pb2.ContextType(name="pipeline_run"))
        self.nodes = {}
        self.runs = {}
        self.uris = []

    def artifact(self, cls, uri: str | None = None, **custom_properties):
        """A stored artifact of TFX class ``cls`` with int or str custom properties, as a TFX Artifact."""
        type_id = self.store.put_artifact_type(metadata_store_pb2.ArtifactType(name=cls.TYPE_NAME))
        proto = metadata_store_pb2.Artifact(type_id=type_id, uri=uri or f"/fake/{cls.TYPE_NAME}/{len(self.uris)}")
        for name, value in custom_properties.items():
            if isinstance(value, str):
                proto.custom_properties[name].string_value = value
            else:
                proto.custom_properties[name].int_value = value
        [artifact_id] = self.store.put_artifacts([proto])
        self.uris.append(proto.uri)
        artifact = cls()
        artifact.set_mlmd_artifact(self.store.get_artifacts_by_id([artifact_id])[0])
        return artifact

    def execution(self, inputs: dict, outputs: dict, node: str | None = None,
                  state=metadata_store_pb2.Execution.COMPLETE, output_event=metadata_store_pb2.Event.OUTPUT,
                  input_event=metadata_store_pb2.Event.INPUT, run: str | None = None) -> int:
        """An execution of ``node`` (a node context of pipeline PIPELINE) with these inputs and outputs, in the
        pipeline run named ``run`` (a ``pipeline_run`` context, as TFX records it) when given."""
        [execution_id] = self.store.put_executions(
            [metadata_store_pb2.Execution(type_id=self.execution_type, last_known_state=state)])
        events = []
        for kind, by_key in ((input_event, inputs), (output_event, outputs)):
            for key, artifacts in by_key.items():
                for a in artifacts:
                    event = metadata_store_pb2.Event(artifact_id=a.id, execution_id=execution_id, type=kind)
                    event.path.steps.add().key = key
                    events.append(event)
        self.store.put_events(events)
        if node is not None:
            if node not in self.nodes:
                [self.nodes[node]] = self.store.put_contexts(
                    [metadata_store_pb2.Context(type_id=self.node_type, name=f"{PIPELINE}.{node}")])
            association = metadata_store_pb2.Association(execution_id=execution_id, context_id=self.nodes[node])
            self.store.put_attributions_and_associations([], [association])
        if run is not None:
            if run not in self.runs:
                [self.runs[run]] = self.store.put_contexts(
                    [metadata_store_pb2.Context(type_id=self.run_type, name=run)])
            association = metadata_store_pb2.Association(execution_id=execution_id, context_id=self.runs[run])
            self.store.put_attributions_and_associations([], [association])
        return execution_id

    def blessing(self, model, blessed=True):
        return self.artifact(standard_artifacts.ModelBlessing, blessed=int(blessed), current_model_id=model.id)
