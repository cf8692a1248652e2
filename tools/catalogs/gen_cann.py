"""Generate udal/ascend_cann_catalog.yaml: CANN error codes of the E* families beyond EI/EJ.

Transcribed from CANN's open-sourced error-message registries (REG_FORMAT_ERROR_MSG JSON: errTitle,
ErrCode, ErrMessage, suggestion.Possible Cause, suggestion.Solution) and from the CANN troubleshooting
page that lists the modules' internal error codes.
"""

from __future__ import annotations

import re

from common import row, write

INTERNAL_ZH = "E*9***表示系统内部错误码，请根据报错信息进行问题排查。如果问题仍然存在，请联系技术支持。"
INTERNAL = [
    "E29999",
    "E39999",
    "E49999",
    "E59999",
    "E69999",
    "E79999",
    "E89999",
    "E99999",
    "EA9999",
    "EC9999",
    "ED9999",
    "EF9999",
    "EG9999",
    "EH9999",
    "EI9999",
    "EJ9999",
    "EK9999",
    "EL9999",
    "EN9999",
    "EO9999",
]  # EE9999 is a row of ascend_catalog.yaml; EZ9999 comes from the aclnn registry below.

NA = "N/A"
# (code, errClass, errTitle, ErrMessage, Possible Cause, Solution)
REGISTRY = [
    (
        "EZ9999",
        "AclNN Errors",
        "AclNN_Inner_Error",
        "%s",
        NA,
        "1. Check whether the CANN package is correct.\n2. Check whether the environment variable is correct.",
    ),
    ("EZ1001", "AclNN Errors", "AclNN_Parameter_Error", "%s", NA, NA),
    (
        "EZ9903",
        "AclNN Errors",
        "AclNN_Runtime_Error",
        "%s",
        NA,
        "In this scenario, collect the plog when the fault occurs and locate the fault based on the plog.",
    ),
    (
        "E10001",
        "GE Errors",
        "Invalid_Argument",
        "Value %s for parameter %s is invalid. Reason: %s",
        NA,
        "Try again with a valid argument.",
    ),
    (
        "E10055",
        "GE Errors",
        "Not_Supported",
        "The operation is not supported. Reason: %s.",
        NA,
        "Check whether the configured parameter or used function is supported.",
    ),
    ("E10059", "GE Errors", "Invalid_Argument", "%s failed. Reason: %s.", NA, "N/A."),
    ("E10060", "GE Errors", "Invalid_Argument", "Parameter is invalid. Reason: %s.", NA, "N/A."),
    (
        "E10061",
        "GE Errors",
        "Invalid_Argument",
        "Value %s for parameter %s is invalid. Expected value: %s.",
        NA,
        "N/A.",
    ),
    (
        "E10401",
        "GE Errors",
        "Invalid_Argument_Operator_Input_Count",
        "The number of operator inputs %s exceeds the allowed maximum %s.",
        NA,
        "Try again with a valid number of inputs.",
    ),
    (
        "E10402",
        "GE Errors",
        "Invalid_Argument_Operator_Input_Buffer",
        "Input indexed %s requires a %s buffer, but %s aligned buffer is allocated.",
        NA,
        "Check whether the data type, dimensions, and shape are correctly set. For details, see the aclGetTensorDescSize API description in API Reference.",
    ),
    (
        "E10403",
        "GE Errors",
        "Invalid_Argument_Operator_Output_Count",
        "The number of operator outputs %s exceeds the allowed maximum %s.",
        "The number of outputs configured for operator execution does not match that described in the operator specifications.",
        "Check whether the number of elements in numoutputs is correctly set. The aclopCompile, aclopExecuteV2, and aclopCompileAndExecute APIs may be involved. For details, see API Reference.",
    ),
    (
        "E10404",
        "GE Errors",
        "Invalid_Argument_Operator_Output_Buffer",
        "Output indexed %s requires a %s buffer, but %s aligned buffer is allocated.",
        NA,
        "Check whether the data type, dimensions, and shape are correctly set. For details, see the aclGetTensorDescSize API description in API Reference.",
    ),
    (
        "E10405",
        "GE Errors",
        "Invalid_Argument",
        "The number of input buffers is %s, which does not match the number of input tensors %s.",
        NA,
        "Check whether the number of elements in inputDesc and inputs of the operator is correctly set. The aclopExecuteV2 and aclopCompileAndExecute APIs may be involved. For details, see API Reference.",
    ),
    (
        "E10406",
        "GE Errors",
        "Invalid_Argument",
        "The number of output buffers is %s, which does not match the number of output tensors %s.",
        NA,
        "Check whether the number of elements in outputDesc and outputs of the operator is correctly set. The aclopExecuteV2 and aclopCompileAndExecute APIs may be involved. For details, see API Reference.",
    ),
    (
        "E10410",
        "GE Errors",
        "File_Operation_Error_File_Not_Exist",
        "File %s does not exist.",
        "The file specified by the --keep_dtype or --compress_weight_conf argument does not exist.",
        "Try again with a valid file directory.",
    ),
    (
        "E10501",
        "GE Errors",
        "Not_Supported_Operator",
        "IR for Op %s with optype %s is not registered.",
        "1. The environment variable ASCEND_OPP_PATH is not configured. 2. IR is not registered.",
        "1. Check whether ASCEND_OPP_PATH is correctly set. 2. Check whether the operator prototype has been registered. For details, see the operator developer guide.",
    ),
    (
        "E13000",
        "GE Errors",
        "File_Operation_Error_Invalid_Path",
        "Path %s is empty. Reason: %s.",
        "The file does not exist.",
        "Try again with a valid directory.",
    ),
    (
        "E13001",
        "GE Errors",
        "File_Operation_Error_Open",
        "Failed to open file %s. Reason: %s.",
        NA,
        "Fix the error according to the error message.",
    ),
    (
        "E13002",
        "GE Errors",
        "Directory_Operation_Error_Name_Too_Long",
        "Directory %s is too long. Keep the length within %s characters.",
        NA,
        "Try again with a valid file directory.",
    ),
    (
        "E13003",
        "GE Errors",
        "File_Operation_Error_Read",
        "Failed to read file %s. Reason: %s.",
        "Failed to read the file.",
        "Fix the error according to the error message.",
    ),
    ("E13004", "GE Errors", "File_Operation_Error_Write", "Failed to write file %s. Reason: %s.", NA, NA),
    (
        "E13005",
        "GE Errors",
        "File_Operation_Error_Parse",
        "Failed to parse file %s.",
        NA,
        'Check that a matched Protobuf version is installed and try again with a valid file. For details, see section "--framework" in ATC Instructions.',
    ),
    (
        "E13009",
        "GE Errors",
        "Invalid_Argument_Operator_Name",
        "Operator %s already exists in the graph. Ensure that operator names are unique.",
        NA,
        "Ensure that the operators in the graph have unique names.",
    ),
    (
        "E13010",
        "GE Errors",
        "Not_Supported_Operator",
        "No operator plugin is registered for Op: %s, optype: %s.",
        NA,
        "1. If the operator is a custom operator, register related deliverables.\n2. If the operator is a built-in operator, install the package that supports this operator version.",
    ),
    ("E13014", "GE Errors", "Invalid_Argument", "Value %s of parameter %s for Op %s is invalid. Reason: %s.", NA, NA),
    (
        "E13015",
        "GE Errors",
        "File_Operation_Error_Invalid_File_Size",
        "File %s has a size of %s, which is out of valid range (0, %s].",
        NA,
        NA,
    ),
    (
        "E13023",
        "GE Errors",
        "Invalid_Argument_OM_Model_Size",
        "Model %s has a size of %s bytes, which exceeds system limit of %s bytes.",
        "The generated OM model is too large and therefore cannot be dumped to the disk.",
        "Reduce the model size.",
    ),
    (
        "E13024",
        "GE Errors",
        "Config_Error_Invalid_Environment_Variable",
        "Value %s for environment variable %s is invalid. Reason: %s.",
        NA,
        "Reset the environment variable by referring to the setup guide.",
    ),
    ("E13025", "GE Errors", "Invalid_Argument", "Input tensor is invalid. Reason: %s.", NA, NA),
    ("E13026", "GE Errors", "File_Operation_Error_Invalid_Path", "Input path %s is invalid. Reason: %s", NA, NA),
    (
        "E13027",
        "GE Errors",
        "Invalid_Argument_Network_Connection",
        "Failed to connect to the peer address %s.",
        "The ipaddr, port or token is invalid.",
        "Check the ipaddr, port or token in the configuration file, and ensure that the configuration is correct.",
    ),
    (
        "E13028",
        "GE Errors",
        "Compilation_Error_Execute_Custom_Fusion_Pass",
        "Failed to run custom fusion pass %s. Return code: %s. Reason: %s.",
        NA,
        "Check the error log for details and verify whether the fusion logic is correct.",
    ),
    (
        "E13029",
        "GE Errors",
        "Compilation_Error_Load_Custom_Fusion_Pass",
        "Failed to load custom fusion pass lib %s. Reason: %s.",
        NA,
        "Analyze the failure reason mentioned above. Below are some typical solutions for common dlopen failures:\n1. Verify that the library path is correct and the file exists.\n2. Ensure the library and its dependencies have the correct permissions.\n3. Check that all dependencies are available using the 'ldd' command.",
    ),
    (
        "E13030",
        "GE Errors",
        "Initialization_Error_Register_Custom_Fusion_Pass",
        "Failed to get custom fusion pass func %s. Reason: %s.",
        NA,
        "Check that custom pass registration is valid.",
    ),
    ("E13031", "GE Errors", "Invalid_Argument", "Output tensor is invalid. Reason: %s.", NA, NA),
    (
        "E14001",
        "GE Errors",
        "Invalid_Argument_Operator_Compilation_Parameter",
        "Argument %s for Op %s with optype %s is invalid. Reason: %s.",
        NA,
        "Check whether the type, input, and output of the operator match the configured parameters.",
    ),
    (
        "E19999",
        "GE Errors",
        "Inner_Error",
        "Unknown error occurred. Please check the log.",
        "System terminated abnormally without valid error messages.",
        "In this scenario, collect the logs generated when the fault occurs and locate the fault based on the logs.",
    ),
    (
        "E14002",
        "GE Errors",
        "Invalid_Argument_Tensor_Attribute",
        "In the current process, the attribute of %s must be obtained successfully. Reason: %s.",
        NA,
        "The attribute in the error message must be set for the operator.",
    ),
    # TBE Pass compiler (back-end) errors: an operator failed to compile for the shapes, types and
    # attributes the program gave it. CANN error-code reference, "TBE Pass Compiler Errors" (CANN 8.5 /
    # 9.0 maintenref atlaserrorcode_15_0154-0160; the 8.0-8.3 pages call the family "TBE Pass
    # Compilation Tool Errors (Back-End)"). EB3000 (Memory Error) is listed there but its page was not
    # found in the searched sources, so it is not transcribed.
    (
        "EB0000",
        "TBE Pass Compiler Errors",
        "Compilation_Error",
        "Failed to compile the operator. Reason:%s, %s",
        "The IR is invalid.",
        "Check that the Compute and Schedule APIs are used correctly. For details, see the TBE Custom Operator Developer Guide. If the error persists, contact Huawei technical support.",
    ),
    (
        "EB0500",
        "TBE Pass Compiler Errors",
        "Compilation_Error",
        "Compiler Error check failed. Reason: %s",
        "Please analyze reason according to the ErrMessage.",
        "Please modify the configuration according to the ErrMessage.",
    ),
    (
        "EB1000",
        "TBE Pass Compiler Errors",
        "Compilation_Error_Invalid_Primitives",
        "Primitives check failed. Reason: %s",
        "1. The Primitives are not properly used or not aligned.\n2. Incorrect parameter types are used.\n3. The correct primitive is not punched on the corresponding axis.",
        "Check the schedule and compute statements to ensure that the schedule is correct.",
    ),
    (
        "EB4000",
        "TBE Pass Compiler Errors",
        "Compilation_Error_Invalid_Emit_Insn",
        "Insn check failed. Reason: %s",
        "The command parameter is incorrect.",
        "Check whether the offset address of the instruction map is aligned and whether the correct instruction is selected.",
    ),
    (
        "EB9000",
        "TBE Pass Compiler Errors",
        "Compilation_Error",
        "Compiler Error check failed. Reason: %s",
        "The IR is invalid.",
        NA,
    ),
]

# Codes of the registry that say something about the node rather than the program.
CLASS = {
    "EZ9999": ("unknown", "unknown", "contact_support"),
    "EZ9903": ("device_error", "unknown", "contact_support"),
    "E19999": ("unknown", "unknown", "contact_support"),
    "E13001": ("storage_error", "system", "notify_owner"),
    "E13003": ("storage_error", "system", "notify_owner"),
    "E13004": ("storage_error", "system", "notify_owner"),
    "E13027": ("comm_init", "interconnect", "notify_owner"),
}


def steps_of(solution: str) -> list[str] | None:
    """A numbered Solution ("1. ... 2. ...") as its ordered steps; N/A as none."""
    if solution in (NA, "N/A."):
        return None
    parts = [p.strip() for p in re.split(r"(?<=[.)])\s*(?=\d\. )|\n(?=\d\. )", solution) if p.strip()]
    if len(parts) > 1:
        return [re.sub(r"^\d\.\s*", "", p) for p in parts]
    return [solution]


def main() -> None:
    rows = []
    for code in INTERNAL:
        rows.append(
            row(
                code,
                mnemonic=None,
                description=INTERNAL_ZH,
                action="contact_support",
                origin="unknown",
                fault_class="unknown",
                en=f"CANN reported {code}, an internal error code of a CANN module (E*9999); read the message after the code and the plog.",
                zh=f"CANN 上报内部错误码 {code}（E*9999）；请阅读错误码后的信息并查看 plog。",
                note="CANN troubleshooting, internal error codes E*9999 (CANN 8.1.RC1): the page lists the code with this one shared description. Action = the page's advice (contact support if it persists).",
                steps=["请根据报错信息进行问题排查。", "如果问题仍然存在，请联系技术支持。"],
            )
        )
    for code, err_class, title, message, cause, solution in REGISTRY:
        fault_class, origin, action = CLASS.get(code, ("app_error", "application", "notify_owner"))
        rows.append(
            row(
                code,
                mnemonic=title,
                description=message,
                action=action,
                origin=origin,
                fault_class=fault_class,
                en=f"CANN reported {code} ({err_class}: {title}).",
                zh=f"CANN 上报 {code}（{err_class}：{title}）。",
                note=(
                    f"{err_class} error-message registry: errTitle -> mnemonic, ErrMessage -> description (verbatim, with %s placeholders). Action chosen by trainmedic from the Solution text."
                    if not code.startswith("EB")
                    else f"CANN error-code reference, {err_class}: title -> mnemonic, Symptom -> description (verbatim, with %s placeholders). An operator that fails to compile for what the program gave it: app_error, notify_owner."
                ),
                causes=steps_of(cause),
                steps=steps_of(solution),
                texts=[message] if message != "%s" else None,
            )
        )
    header = """# Huawei Ascend CANN error codes (families E1-E9xxxx, EA-EO, EZ) for trainmedic (chip: ascend). Loaded by
# udal/ascend.py with ascend_catalog.yaml (which keeps the EI/EJ rows, EE9999 and EL0004).
#
# Sources:
# 1. E*9999 internal error codes: CANN "Troubleshooting" / error-code reference, internal error codes
#    (https://www.hiascend.com/doc_center/source/zh/CANNCommunityEdition/81RC1beta1/maintenref/troubleshooting/atlaserrorcode_15_0314.html,
#    CANN 8.1.RC1 beta1): the list E19999 .. EZ9999 with the shared text, transcribed verbatim (zh).
# 2. EZ9999 / EZ1001 / EZ9903: the AclNN (opbase) error-message registry (REG_FORMAT_ERROR_MSG JSON in CANN's
#    open-sourced opbase, 2025): errTitle -> mnemonic, ErrMessage -> description, Possible Cause -> causes,
#    Solution -> steps, verbatim; ErrMessage is also the row's `texts` for lookup_text.
# 3. E10xxx-E14xxx, E19999 ("GE Errors"): GE's error-message registry (cann/ge, ge_error_code JSON, 2025),
#    same mapping. Only the codes a training job can meet at run time were transcribed (argument, operator,
#    file, environment and network errors, and E19999 Inner_Error); the ATC model-conversion codes
#    (Caffe / TensorFlow / ONNX parsing, dynamic-shape options: E10002-E10054, E11xxx, E12xxx, E16xxx) were
#    left out.
# 4. EB0000 / EB0500 / EB1000 / EB4000 / EB9000 ("TBE Pass Compiler Errors", operator compilation): CANN
#    error-code reference pages (maintenref troubleshooting atlaserrorcode_15_0154-0160, CANN 8.5 / 9.0):
#    title -> mnemonic, Symptom -> description, Possible Cause -> causes, Solution -> steps, verbatim.
#    EB3000 is listed there without a page in the searched sources and is left out.
# NOT found in the searched sources: the per-code tables of the EE (runtime), EL (driver/memory), EH,
#   EK families and the other E2-E9 module registries (FE, AICPU, TBE front-end ...); only their internal
#   E*9999 codes are here. EL0004 and EE9999 stay inferred rows of ascend_catalog.yaml.
# vendor_action is null (no bucket); action / fault_class / severity / message are trainmedic's.
# Generated by tools/catalogs/gen_cann.py.
"""
    write(
        "ascend_cann_catalog.yaml",
        header,
        {
            "chip": "ascend",
            "source": {
                "title": "CANN error-message registries (GE, AclNN) and internal error codes E*9999",
                "url": "https://www.hiascend.com/doc_center/source/zh/CANNCommunityEdition/81RC1beta1/maintenref/troubleshooting/atlaserrorcode_15_0314.html",
                "version": "CANN 8.1.RC1 beta1 troubleshooting; ge and opbase registries 2025",
            },
            "action_map": {},
            "entries": rows,
        },
    )


if __name__ == "__main__":
    main()
